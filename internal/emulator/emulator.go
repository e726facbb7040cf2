// Package emulator runs Google's Cloud Pub/Sub emulator (Debian package
// google-cloud-cli-pubsub-emulator) as a child process and speaks the part of
// its REST API a push test needs: topics, push subscriptions with a
// dead-letter policy, publish, pull and acknowledge.
//
// It exists so that the soak and the tests can drive the gateway with the
// broker its users run behind, not only with the repository's own simulator
// (internal/soak/pushsim): the emulator builds the push envelope, chooses the
// message ids, decides what an ack is and when to redeliver.
//
// What the emulator does, as observed with version 0.8.20 (Cloud SDK 528),
// and what its users must not assume of Pub/Sub itself:
//
//   - One push at a time per subscription: it pulls one message, POSTs it,
//     and only then takes the next. It never pushes two copies at once.
//   - Acks are 102, 200, 201, 203 and 204; anything else, a broken
//     connection or a connect timeout (the ack deadline) is a nack. Without
//     a retry policy the message comes back about a second later, with no
//     backoff however long the endpoint fails.
//   - It sets no read timeout on a push: an endpoint that accepts and never
//     answers holds the subscription. Put something with a timeout in front
//     of an endpoint that may hang.
//   - The wrapped envelope carries message_id/messageId and
//     publish_time/publishTime, the attributes and the subscription, and no
//     deliveryAttempt, even with a dead-letter policy; pull does carry
//     deliveryAttempt then. A dead-lettered message is published to the
//     dead-letter topic under a new message id with its attributes kept and
//     CloudPubSubDeadLetterSource* attributes added.
//   - Names shorter than three characters are refused.
//
// A REST client of a few calls is written here rather than taking Google's Go
// client: that would bring gRPC stubs and the cloud authentication libraries
// into the module for five JSON requests to a local process.
package emulator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Package is the Debian package that carries the emulator.
const Package = "google-cloud-cli-pubsub-emulator"

// AllowMissingEnv is the environment variable that lets the tests which
// need the emulator pass, with a loud message, on a machine where the
// package cannot be had. Without it they fail.
const AllowMissingEnv = "ACKGATE_ALLOW_NO_PUBSUB_EMULATOR"

// LauncherEnv names a launcher (cloud-pubsub-emulator) to use instead of
// the one found in the Cloud SDK.
const LauncherEnv = "ACKGATE_PUBSUB_EMULATOR"

// ErrNotInstalled is wrapped by Find when there is no emulator.
var ErrNotInstalled = errors.New("the Cloud Pub/Sub emulator is not installed")

// sdkRoots are where Google's packages and installer put the Cloud SDK.
var sdkRoots = []string{"/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk", "/opt/google-cloud-sdk"}

// Find returns the emulator's launcher: $ACKGATE_PUBSUB_EMULATOR, or
// platform/pubsub-emulator/bin/cloud-pubsub-emulator under the Cloud SDK
// that gcloud belongs to, or under a usual SDK root. Its error says how to
// install the emulator.
func Find() (string, error) {
	if p := os.Getenv(LauncherEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNotInstalled, LauncherEnv, p, err)
		}
		return p, nil
	}
	roots := sdkRoots
	if g, err := exec.LookPath("gcloud"); err == nil {
		if real, err := filepath.EvalSymlinks(g); err == nil {
			roots = append([]string{filepath.Dir(filepath.Dir(real))}, roots...)
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(home, "google-cloud-sdk"))
	}
	for _, r := range roots {
		p := filepath.Join(r, "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: no cloud-pubsub-emulator under %s; install the Debian package %s "+
		"(scripts/services.sh does when Google's apt repository is configured), or set %s to its launcher",
		ErrNotInstalled, strings.Join(roots, ", "), Package, LauncherEnv)
}

// Emulator is a running emulator on a loopback port.
type Emulator struct {
	// URL is its REST base, http://127.0.0.1:port.
	URL    string
	cmd    *exec.Cmd
	done   chan struct{}
	log    *syncBuffer
	client *http.Client
}

// startTimeout bounds the JVM's start.
const startTimeout = 90 * time.Second

// Start runs the launcher on a free loopback port and waits until it
// answers. log receives the emulator's output (nil discards it). Stop ends
// it; so does the death of the calling process.
func Start(ctx context.Context, launcher string, log io.Writer) (*Emulator, error) {
	var lastErr error
	for range 3 { // another process may take the free port first
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		e, err := start(ctx, launcher, port, log)
		if err == nil {
			return e, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(ctx context.Context, launcher string, port int, log io.Writer) (*Emulator, error) {
	buf := &syncBuffer{}
	var out io.Writer = buf
	if log != nil {
		out = io.MultiWriter(buf, log)
	}
	cmd := exec.Command(launcher, "--host=127.0.0.1", "--port="+strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = out, out
	// The launcher execs java: the signal reaches the JVM itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	e := &Emulator{
		URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, done: make(chan struct{}), log: buf,
		client: &http.Client{Timeout: 30 * time.Second},
	}
	go func() { _ = cmd.Wait(); close(e.done) }()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		resp, err := e.client.Get(e.URL + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, nil
			}
			err = fmt.Errorf("GET / answered %s", resp.Status)
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("emulator exited before it answered (%v):\n%s", err, buf.String())
		case <-ctx.Done():
			e.Stop()
			return nil, fmt.Errorf("emulator did not answer on %s within %s: %v\n%s", e.URL, startTimeout, err, buf.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop kills the emulator (it keeps nothing worth a clean shutdown) and
// waits for it to exit.
func (e *Emulator) Stop() {
	select {
	case <-e.done:
		return
	default:
	}
	_ = e.cmd.Process.Kill()
	<-e.done
}

// Log is what the emulator has written so far.
func (e *Emulator) Log() string { return e.log.String() }

// Subscription is a push subscription to create.
type Subscription struct {
	// Name and Topic are full names: projects/P/subscriptions/S,
	// projects/P/topics/T.
	Name, Topic string
	// PushEndpoint is where the emulator POSTs each message; "" makes a
	// pull subscription.
	PushEndpoint string
	// AckDeadline is whole seconds, 10 to 600.
	AckDeadline time.Duration
	// DeadLetterTopic and MaxDeliveryAttempts (5 to 100) are the
	// dead-letter policy; none when DeadLetterTopic is "".
	DeadLetterTopic     string
	MaxDeliveryAttempts int
}

// CreateTopic creates projects/P/topics/T.
func (e *Emulator) CreateTopic(ctx context.Context, name string) error {
	return e.call(ctx, http.MethodPut, "/v1/"+name, struct{}{}, nil)
}

// CreateSubscription creates s.
func (e *Emulator) CreateSubscription(ctx context.Context, s Subscription) error {
	body := map[string]any{"topic": s.Topic, "ackDeadlineSeconds": int(s.AckDeadline / time.Second)}
	if s.PushEndpoint != "" {
		body["pushConfig"] = map[string]any{"pushEndpoint": s.PushEndpoint}
	}
	if s.DeadLetterTopic != "" {
		body["deadLetterPolicy"] = map[string]any{"deadLetterTopic": s.DeadLetterTopic, "maxDeliveryAttempts": s.MaxDeliveryAttempts}
	}
	return e.call(ctx, http.MethodPut, "/v1/"+s.Name, body, nil)
}

// StopPushing turns a push subscription into a pull one: the emulator stops
// pushing, and what it still holds can be pulled.
func (e *Emulator) StopPushing(ctx context.Context, subscription string) error {
	return e.call(ctx, http.MethodPost, "/v1/"+subscription+":modifyPushConfig", map[string]any{"pushConfig": map[string]any{}}, nil)
}

// Message is one message to publish.
type Message struct {
	Data       []byte
	Attributes map[string]string
}

// Publish publishes msgs to topic and returns the message ids the emulator
// gave them, in order.
func (e *Emulator) Publish(ctx context.Context, topic string, msgs ...Message) ([]string, error) {
	type wire struct {
		Data       string            `json:"data"`
		Attributes map[string]string `json:"attributes,omitempty"`
	}
	req := struct {
		Messages []wire `json:"messages"`
	}{}
	for _, m := range msgs {
		req.Messages = append(req.Messages, wire{Data: base64.StdEncoding.EncodeToString(m.Data), Attributes: m.Attributes})
	}
	var resp struct {
		MessageIDs []string `json:"messageIds"`
	}
	if err := e.call(ctx, http.MethodPost, "/v1/"+topic+":publish", req, &resp); err != nil {
		return nil, err
	}
	if len(resp.MessageIDs) != len(msgs) {
		return nil, fmt.Errorf("emulator: publish to %s: %d ids for %d messages", topic, len(resp.MessageIDs), len(msgs))
	}
	return resp.MessageIDs, nil
}

// Received is a pulled message.
type Received struct {
	AckID           string
	MessageID       string
	Data            []byte
	Attributes      map[string]string
	DeliveryAttempt int
}

// Pull takes up to max messages that are available now, without waiting for
// more.
func (e *Emulator) Pull(ctx context.Context, subscription string, max int) ([]Received, error) {
	var resp struct {
		ReceivedMessages []struct {
			AckID   string `json:"ackId"`
			Message struct {
				Data       string            `json:"data"`
				Attributes map[string]string `json:"attributes"`
				MessageID  string            `json:"messageId"`
			} `json:"message"`
			DeliveryAttempt int `json:"deliveryAttempt"`
		} `json:"receivedMessages"`
	}
	req := map[string]any{"maxMessages": max, "returnImmediately": true}
	if err := e.call(ctx, http.MethodPost, "/v1/"+subscription+":pull", req, &resp); err != nil {
		return nil, err
	}
	out := make([]Received, 0, len(resp.ReceivedMessages))
	for _, r := range resp.ReceivedMessages {
		data, err := base64.StdEncoding.DecodeString(r.Message.Data)
		if err != nil {
			return nil, fmt.Errorf("emulator: pull %s: message %s: %w", subscription, r.Message.MessageID, err)
		}
		out = append(out, Received{AckID: r.AckID, MessageID: r.Message.MessageID, Data: data,
			Attributes: r.Message.Attributes, DeliveryAttempt: r.DeliveryAttempt})
	}
	return out, nil
}

// Acknowledge acks pulled messages.
func (e *Emulator) Acknowledge(ctx context.Context, subscription string, ackIDs ...string) error {
	if len(ackIDs) == 0 {
		return nil
	}
	return e.call(ctx, http.MethodPost, "/v1/"+subscription+":acknowledge", map[string]any{"ackIds": ackIDs}, nil)
}

func (e *Emulator) call(ctx context.Context, method, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, e.URL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("emulator: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("emulator: %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("emulator: %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("emulator: %s %s: %w", method, path, err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
