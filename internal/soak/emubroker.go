package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ackgate/ackgate/internal/emulator"
	"github.com/ackgate/ackgate/internal/soak/pushsim"
)

// broker is what a run publishes to: the push simulator, or Google's
// emulator behind the soak's own load balancer.
type broker interface {
	Publish(ctx context.Context, m pushsim.Message) int
	// Timeline is every push's answer with its time.
	Timeline() []pushsim.Answer
	// Settled returns a publication's outcome and whether the broker is
	// done with it.
	Settled(h int) (pushsim.Outcome, bool)
	Unsettled() int
	Stats() pushsim.Stats
	Close()
}

// Attributes the soak adds to what it publishes through the emulator, which
// chooses the message ids itself: the operation key the routes use, and the
// publication's handle, which a push and a dead letter carry back.
const (
	keyAttribute = "soak_key"
	pubAttribute = "soak_pub"
	emuProject   = "soak"
)

func topic(route string) string { return "projects/" + emuProject + "/topics/" + route }

// emulatorAck is what the emulator counts as an ack (102, 200, 201, 203,
// 204: not 202, unlike Pub/Sub).
func emulatorAck(status int) bool {
	switch status {
	case 102, http.StatusOK, http.StatusCreated, http.StatusNonAuthoritativeInfo, http.StatusNoContent:
		return true
	}
	return false
}

// emuBroker publishes to the emulator, which pushes each subscription's
// messages one at a time to a load balancer of the soak's own. The load
// balancer sends each push to one of the gateways at random, answers the
// emulator with the gateway's status (502 when the gateway is down, 504
// past the ack deadline: the emulator itself sets no read timeout), and
// records each answer against the publication it carried. With a
// dead-letter policy, each route has a dead-letter topic whose messages
// the broker pulls to learn what the subscription gave up on.
type emuBroker struct {
	emu      *emulator.Emulator
	gateways []string
	client   *http.Client
	lb       *http.Server
	lbURL    string
	dlq      []string // dead-letter pull subscriptions
	subs     []string
	stop     chan struct{}
	polling  sync.WaitGroup
	// Publishing runs beside the caller, a few calls at once: the
	// emulator answers a publish in milliseconds, which one after the
	// other would fall behind the run's rate.
	publishing sync.WaitGroup
	slots      chan struct{}

	mu      sync.Mutex
	rng     *rand.Rand
	outs    []pushsim.Outcome
	settled []bool
	pending int
	stats   pushsim.Stats
	// withAttempt counts pushes whose envelope carried deliveryAttempt.
	withAttempt int
	timeline    []pushsim.Answer
}

type emuConfig struct {
	Launcher    string
	Log         io.Writer
	Gateways    []string
	Routes      []string
	AckDeadline time.Duration
	// MaxDeliveryAttempts > 0 gives each subscription a dead-letter policy.
	MaxDeliveryAttempts int
	Seed                uint64
}

func newEmuBroker(ctx context.Context, cfg emuConfig) (_ *emuBroker, err error) {
	b := &emuBroker{
		gateways: cfg.Gateways, stop: make(chan struct{}), slots: make(chan struct{}, 8),
		client: &http.Client{Timeout: cfg.AckDeadline, Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}},
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x2545f4914f6cdd1d)),
		stats:  pushsim.Stats{Statuses: map[int]int{}},
	}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b.lb = &http.Server{Handler: http.HandlerFunc(b.forward), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.lb.Serve(ln) }()
	b.lbURL = "http://" + ln.Addr().String()
	if b.emu, err = emulator.Start(ctx, cfg.Launcher, cfg.Log); err != nil {
		return nil, err
	}
	for _, rt := range cfg.Routes {
		if err := b.emu.CreateTopic(ctx, topic(rt)); err != nil {
			return nil, err
		}
		s := emulator.Subscription{Name: subscription(rt), Topic: topic(rt), PushEndpoint: b.lbURL + "/v1/push/pubsub/" + rt,
			AckDeadline: cfg.AckDeadline}
		if cfg.MaxDeliveryAttempts > 0 {
			dead := topic(rt + "-dead")
			if err := b.emu.CreateTopic(ctx, dead); err != nil {
				return nil, err
			}
			pull := subscription(rt + "-dead")
			if err := b.emu.CreateSubscription(ctx, emulator.Subscription{Name: pull, Topic: dead, AckDeadline: cfg.AckDeadline}); err != nil {
				return nil, err
			}
			b.dlq = append(b.dlq, pull)
			s.DeadLetterTopic, s.MaxDeliveryAttempts = dead, cfg.MaxDeliveryAttempts
		}
		if err := b.emu.CreateSubscription(ctx, s); err != nil {
			return nil, err
		}
		b.subs = append(b.subs, s.Name)
	}
	if len(b.dlq) > 0 {
		b.polling.Go(b.pollDeadLetters)
	}
	return b, nil
}

// Publish publishes m to its route's topic with the soak's attributes, in
// the background. A publication the emulator refuses three times is
// abandoned.
func (b *emuBroker) Publish(ctx context.Context, m pushsim.Message) int {
	b.mu.Lock()
	h := len(b.outs)
	b.outs = append(b.outs, pushsim.Outcome{})
	b.settled = append(b.settled, false)
	b.pending++
	b.mu.Unlock()
	attrs := map[string]string{keyAttribute: m.ID, pubAttribute: strconv.Itoa(h)}
	for k, v := range m.Attributes {
		attrs[k] = v
	}
	b.slots <- struct{}{}
	b.publishing.Go(func() {
		defer func() { <-b.slots }()
		for range 3 {
			if _, err := b.emu.Publish(ctx, topic(m.Route), emulator.Message{Data: m.Data, Attributes: attrs}); err == nil {
				return
			}
		}
		b.settle(h, func(o *pushsim.Outcome) bool { o.Abandoned = true; return true })
	})
	return h
}

// settle applies f to publication h's outcome; f reports whether that
// settles it.
func (b *emuBroker) settle(h int, f func(*pushsim.Outcome) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h < 0 || h >= len(b.outs) {
		return
	}
	if f(&b.outs[h]) && !b.settled[h] {
		b.settled[h] = true
		b.pending--
		switch o := b.outs[h]; {
		case o.Acked:
			b.stats.Acked++
		case o.DeadLettered:
			b.stats.DeadLettered++
		default:
			b.stats.Abandoned++
		}
	}
}

// forward is the load balancer.
func (b *emuBroker) forward(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	var env struct {
		Message struct {
			Attributes map[string]string `json:"attributes"`
		} `json:"message"`
		DeliveryAttempt *int `json:"deliveryAttempt"`
	}
	_ = json.Unmarshal(body, &env)
	h, err := strconv.Atoi(env.Message.Attributes[pubAttribute])
	if err != nil {
		h = -1
	}
	b.mu.Lock()
	target := b.gateways[b.rng.IntN(len(b.gateways))]
	if env.DeliveryAttempt != nil {
		b.withAttempt++
	}
	b.mu.Unlock()

	status, timedOut := b.post(r.Context(), target+r.URL.Path, body)
	b.mu.Lock()
	b.stats.Deliveries++
	b.timeline = append(b.timeline, pushsim.Answer{At: time.Now(), Status: status})
	switch {
	case status != 0:
		b.stats.Statuses[status]++
	case timedOut:
		b.stats.Timeouts++
	default:
		b.stats.ConnectionErrors++
	}
	b.mu.Unlock()
	answer := status
	switch {
	case status == 0 && timedOut:
		answer = http.StatusGatewayTimeout
	case status == 0:
		answer = http.StatusBadGateway
	}
	b.settle(h, func(o *pushsim.Outcome) bool {
		o.Deliveries++
		o.Attempts++
		switch {
		case o.Acked || o.DeadLettered:
			o.AfterAck = append(o.AfterAck, status)
			b.stats.RedeliveriesAfter++
			return false
		case emulatorAck(status):
			o.Acked, o.AckStatus = true, status
			return true
		}
		return false
	})
	w.WriteHeader(answer)
}

func (b *emuBroker) post(ctx context.Context, url string, body []byte) (status int, timedOut bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		var ne net.Error
		return 0, errors.As(err, &ne) && ne.Timeout()
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		var ne net.Error
		return 0, errors.As(err, &ne) && ne.Timeout()
	}
	return resp.StatusCode, false
}

// pollDeadLetters pulls the dead-letter topics until Close: each message
// there is a publication the subscription gave up on.
func (b *emuBroker) pollDeadLetters() {
	ctx := context.Background()
	for {
		select {
		case <-b.stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
		for _, sub := range b.dlq {
			msgs, err := b.emu.Pull(ctx, sub, 100)
			if err != nil {
				continue
			}
			ids := make([]string, 0, len(msgs))
			for _, m := range msgs {
				ids = append(ids, m.AckID)
				h, err := strconv.Atoi(m.Attributes[pubAttribute])
				if err != nil {
					continue
				}
				b.settle(h, func(o *pushsim.Outcome) bool {
					if o.Acked {
						// Acked at the load balancer too late for the
						// emulator: its ack failed and it kept delivering.
						return false
					}
					o.DeadLettered = true
					return true
				})
			}
			_ = b.emu.Acknowledge(ctx, sub, ids...)
		}
	}
}

func (b *emuBroker) Settled(h int) (pushsim.Outcome, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outs[h], b.settled[h]
}

func (b *emuBroker) Unsettled() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending
}

func (b *emuBroker) Stats() pushsim.Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.stats
	st.Statuses = make(map[int]int, len(b.stats.Statuses))
	for k, v := range b.stats.Statuses {
		st.Statuses[k] = v
	}
	return st
}

// held stops every subscription's pushing and pulls what the emulator still
// holds, for as long as a message in flight could take to come back (the
// ack deadline, and a little). Anything there is a message the emulator
// would have gone on delivering: it returns their publications' handles.
func (b *emuBroker) held(ctx context.Context, ackDeadline time.Duration) ([]int, error) {
	for _, s := range b.subs {
		if err := b.emu.StopPushing(ctx, s); err != nil {
			return nil, err
		}
	}
	var out []int
	until := time.Now().Add(ackDeadline + 2*time.Second)
	for time.Now().Before(until) {
		for _, s := range b.subs {
			msgs, err := b.emu.Pull(ctx, s, 100)
			if err != nil {
				return nil, err
			}
			ids := make([]string, 0, len(msgs))
			for _, m := range msgs {
				ids = append(ids, m.AckID)
				h, err := strconv.Atoi(m.Attributes[pubAttribute])
				if err != nil {
					h = -1
				}
				out = append(out, h)
			}
			if err := b.emu.Acknowledge(ctx, s, ids...); err != nil {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return out, nil
}

// Timeline returns every push's answer so far, in order.
func (b *emuBroker) Timeline() []pushsim.Answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]pushsim.Answer(nil), b.timeline...)
}

// pushesWithAttempt counts pushes whose envelope carried deliveryAttempt.
func (b *emuBroker) pushesWithAttempt() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.withAttempt
}

func (b *emuBroker) Close() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	b.polling.Wait()
	b.publishing.Wait()
	if b.lb != nil {
		b.lb.Close()
	}
	if b.emu != nil {
		b.emu.Stop()
	}
	b.client.CloseIdleConnections()
}

var (
	_ broker = (*emuBroker)(nil)
	_ broker = (*pushsim.Sim)(nil)
)

// errBrokerName is a -broker value the soak does not know.
func errBrokerName(name string) error {
	return fmt.Errorf("unknown broker %q (want %q or %q)", name, BrokerPushSim, BrokerEmulator)
}
