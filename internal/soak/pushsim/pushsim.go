// Package pushsim is a Pub/Sub push subscription in miniature. It exists so a
// soak can drive the gateway the way Pub/Sub does, without a cloud project:
// the wrapped envelope, the documented ack statuses, the ack deadline as the
// request timeout, redelivery with exponential backoff, a dead-letter policy
// that gives up after a number of delivery attempts, and the at-least-once
// habits that make push hard (two copies of one delivery at once, another
// delivery after the ack).
//
// It is not an emulator: there is no topic, no ordering and no flow control
// beyond a cap on requests in flight. It records what the broker would know
// about each message, which is what a soak's accounting starts from.
package pushsim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"
)

// IsAck reports whether Pub/Sub reads a push response status as an ack. Every
// other status, a timeout and a broken connection are nacks.
func IsAck(status int) bool {
	switch status {
	case 102, http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent:
		return true
	}
	return false
}

// Backoff is the wait before delivery attempt n+1 after attempt n was nacked:
// min doubled per attempt, capped at max, as a subscription's retry policy does.
func Backoff(minWait, maxWait time.Duration, n int) time.Duration {
	d := minWait
	for i := 1; i < n && d < maxWait; i++ {
		d *= 2
	}
	return min(d, maxWait)
}

// Config describes the subscription and its push endpoints.
type Config struct {
	// Endpoints are the gateways' ingest base URLs (http://host:port); each
	// delivery goes to one of them, as through a load balancer.
	Endpoints []string
	// AckDeadline is how long one push request may take before it counts as
	// a nack: the subscription's ack deadline.
	AckDeadline time.Duration
	// MinBackoff and MaxBackoff bound the wait between deliveries of a nacked
	// message.
	MinBackoff, MaxBackoff time.Duration
	// MaxDeliveryAttempts is the dead-letter policy: after this many nacked
	// deliveries the message leaves the subscription unacknowledged.
	MaxDeliveryAttempts int
	// DuplicateRate is the share of deliveries sent as two copies at once, to
	// two endpoints.
	DuplicateRate float64
	// RedeliverAfterAckRate is the share of acked messages delivered once more
	// after the ack, within RedeliverAfterAckDelay.
	RedeliverAfterAckRate  float64
	RedeliverAfterAckDelay time.Duration
	// Concurrency caps push requests in flight.
	Concurrency int
	Seed        uint64
	// Timeline keeps every push's answer with its time (Timeline), for
	// measuring what a fault cost.
	Timeline bool
}

// Answer is one push request's end: when, and its status (0 for a timeout
// or a broken connection).
type Answer struct {
	At     time.Time
	Status int
}

func (c *Config) validate() error {
	switch {
	case len(c.Endpoints) == 0:
		return errors.New("pushsim: no endpoints")
	case c.AckDeadline <= 0:
		return errors.New("pushsim: ack deadline must be positive")
	case c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff:
		return errors.New("pushsim: backoff must satisfy 0 < min <= max")
	case c.MaxDeliveryAttempts < 1:
		return errors.New("pushsim: max delivery attempts must be at least 1")
	case c.Concurrency < 1:
		return errors.New("pushsim: concurrency must be at least 1")
	}
	return nil
}

// Message is one published message.
type Message struct {
	// Route is the path segment after /v1/push/pubsub/.
	Route        string
	Subscription string
	ID           string
	Data         []byte
	Attributes   map[string]string
	PublishTime  time.Time
}

// Outcome is what the broker knows about a message once it stopped
// delivering it.
type Outcome struct {
	Acked bool
	// AckStatus is the status that acked it.
	AckStatus int
	// DeadLettered: the dead-letter policy took it after MaxDeliveryAttempts.
	DeadLettered bool
	// Abandoned: the run ended (its context was cancelled) before either.
	Abandoned bool
	// Deliveries counts push requests, copies included; Attempts counts
	// delivery attempts (deliveryAttempt), copies not included.
	Deliveries, Attempts int
	// AfterAck holds the statuses answered to deliveries after the ack
	// (0 for a broken connection or a timeout).
	AfterAck []int
}

// Stats counts push requests by how they ended.
type Stats struct {
	Deliveries        int
	Statuses          map[int]int
	Timeouts          int
	ConnectionErrors  int
	Duplicates        int
	RedeliveriesAfter int
	Acked             int
	DeadLettered      int
	Abandoned         int
}

// Sim pushes published messages until each is acked, dead-lettered, or the
// context ends.
type Sim struct {
	cfg    Config
	client *http.Client
	slots  chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	rng      *rand.Rand
	outcomes []Outcome
	settled  []bool
	pending  int
	stats    Stats
	timeline []Answer
}

// New returns a simulator; Publish starts delivering.
func New(cfg Config) (*Sim, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: cfg.AckDeadline}).DialContext,
		MaxIdleConnsPerHost: cfg.Concurrency,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Sim{
		cfg: cfg,
		// The ack deadline is the whole request's limit: Pub/Sub does not
		// wait for a slow endpoint, it redelivers.
		client: &http.Client{Transport: tr, Timeout: cfg.AckDeadline},
		slots:  make(chan struct{}, cfg.Concurrency),
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		stats:  Stats{Statuses: map[int]int{}},
	}, nil
}

// Publish hands m to the subscription and returns its handle for Outcome.
// Delivery runs in the background until Wait returns.
func (s *Sim) Publish(ctx context.Context, m Message) int {
	s.mu.Lock()
	h := len(s.outcomes)
	s.outcomes = append(s.outcomes, Outcome{})
	s.settled = append(s.settled, false)
	s.pending++
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		out := s.deliverUntilSettled(ctx, m)
		s.mu.Lock()
		s.outcomes[h] = out
		s.settled[h] = true
		s.pending--
		switch {
		case out.Acked:
			s.stats.Acked++
		case out.DeadLettered:
			s.stats.DeadLettered++
		default:
			s.stats.Abandoned++
		}
		s.mu.Unlock()
	}()
	return h
}

// Wait blocks until every published message is settled. It ends by itself:
// each message gets at most MaxDeliveryAttempts deliveries.
func (s *Sim) Wait() { s.wg.Wait() }

// Outcome returns the outcome of the message with handle h; call it after Wait.
func (s *Sim) Outcome(h int) Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outcomes[h]
}

// Settled returns the outcome of the message with handle h, and whether it
// is settled yet (acked, dead-lettered or abandoned); it may be called at
// any time.
func (s *Sim) Settled(h int) (Outcome, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outcomes[h], s.settled[h]
}

// Unsettled counts the published messages not settled yet.
func (s *Sim) Unsettled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending
}

// Timeline returns every answer so far, in the order they came (with
// Config.Timeline).
func (s *Sim) Timeline() []Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Answer(nil), s.timeline...)
}

// Stats returns the counts so far.
func (s *Sim) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Statuses = make(map[int]int, len(s.stats.Statuses))
	for k, v := range s.stats.Statuses {
		st.Statuses[k] = v
	}
	return st
}

// Close releases idle connections.
func (s *Sim) Close() { s.client.CloseIdleConnections() }

func (s *Sim) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Float64() < p
}

func (s *Sim) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.IntN(n)
}

// jitter spreads redeliveries by ±20%, so a burst of nacks does not come
// back as a burst.
func (s *Sim) jitter(d time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(float64(d) * (0.8 + 0.4*s.rng.Float64()))
}

func (s *Sim) deliverUntilSettled(ctx context.Context, m Message) Outcome {
	var out Outcome
	for attempt := 1; attempt <= s.cfg.MaxDeliveryAttempts; attempt++ {
		if ctx.Err() != nil {
			out.Abandoned = true
			return out
		}
		out.Attempts = attempt
		copies := 1
		if len(s.cfg.Endpoints) > 1 && s.chance(s.cfg.DuplicateRate) {
			copies = 2
		}
		statuses := s.deliverCopies(ctx, m, attempt, copies)
		out.Deliveries += copies
		for _, st := range statuses {
			if IsAck(st) {
				out.Acked, out.AckStatus = true, st
			}
		}
		if out.Acked {
			s.redeliverAfterAck(ctx, m, attempt+1, &out)
			return out
		}
		if attempt == s.cfg.MaxDeliveryAttempts {
			break
		}
		select {
		case <-ctx.Done():
			out.Abandoned = true
			return out
		case <-time.After(s.jitter(Backoff(s.cfg.MinBackoff, s.cfg.MaxBackoff, attempt))):
		}
	}
	out.DeadLettered = true
	return out
}

// redeliverAfterAck sends one more delivery of an acked message, as Pub/Sub
// may: the gateway must answer it from its evidence, with no new effect.
func (s *Sim) redeliverAfterAck(ctx context.Context, m Message, attempt int, out *Outcome) {
	if !s.chance(s.cfg.RedeliverAfterAckRate) {
		return
	}
	wait := time.Duration(0)
	if s.cfg.RedeliverAfterAckDelay > 0 {
		wait = time.Duration(s.intn(int(s.cfg.RedeliverAfterAckDelay)))
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait):
	}
	st := s.deliverCopies(ctx, m, attempt, 1)
	out.Deliveries++
	out.AfterAck = append(out.AfterAck, st...)
	s.mu.Lock()
	s.stats.RedeliveriesAfter++
	s.mu.Unlock()
}

// deliverCopies pushes copies of one delivery attempt at once, to different
// endpoints, and returns each answer's status (0: timeout or broken).
func (s *Sim) deliverCopies(ctx context.Context, m Message, attempt, copies int) []int {
	body, err := envelope(m, attempt)
	if err != nil {
		// Our own message could not be encoded: a bug in the soak, not a nack.
		panic(err)
	}
	first := s.intn(len(s.cfg.Endpoints))
	statuses := make([]int, copies)
	var wg sync.WaitGroup
	for i := range copies {
		url := s.cfg.Endpoints[(first+i)%len(s.cfg.Endpoints)] + "/v1/push/pubsub/" + m.Route
		wg.Go(func() { statuses[i] = s.push(ctx, url, body) })
	}
	wg.Wait()
	if copies > 1 {
		s.mu.Lock()
		s.stats.Duplicates += copies - 1
		s.mu.Unlock()
	}
	return statuses
}

func (s *Sim) push(ctx context.Context, url string, body []byte) int {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	defer func() { <-s.slots }()
	status, timedOut := s.post(ctx, url, body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Deliveries++
	if s.cfg.Timeline {
		s.timeline = append(s.timeline, Answer{At: time.Now(), Status: status})
	}
	switch {
	case status != 0:
		s.stats.Statuses[status]++
	case timedOut:
		s.stats.Timeouts++
	default:
		s.stats.ConnectionErrors++
	}
	return status
}

func (s *Sim) post(ctx context.Context, url string, body []byte) (status int, timedOut bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		var ne net.Error
		return 0, errors.As(err, &ne) && ne.Timeout()
	}
	// Reading the body to its end is part of the answer: a connection cut
	// mid-body is a broken connection, and the broker cannot count it as an
	// ack.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		resp.Body.Close()
		var ne net.Error
		return 0, errors.As(err, &ne) && ne.Timeout()
	}
	resp.Body.Close()
	return resp.StatusCode, false
}

// envelope is Pub/Sub's wrapped push body, with both spellings of the
// metadata fields as Pub/Sub sends them, and deliveryAttempt because the
// subscription has a dead-letter policy.
func envelope(m Message, attempt int) ([]byte, error) {
	pt := m.PublishTime.UTC().Format(time.RFC3339Nano)
	msg := map[string]any{
		"data":         base64.StdEncoding.EncodeToString(m.Data),
		"messageId":    m.ID,
		"message_id":   m.ID,
		"publishTime":  pt,
		"publish_time": pt,
	}
	if len(m.Attributes) > 0 {
		msg["attributes"] = m.Attributes
	}
	b, err := json.Marshal(map[string]any{
		"message":         msg,
		"subscription":    m.Subscription,
		"deliveryAttempt": attempt,
	})
	if err != nil {
		return nil, fmt.Errorf("pushsim: encode %s: %w", m.ID, err)
	}
	return b, nil
}
