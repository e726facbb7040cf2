package emulator_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/emulator"
	"github.com/ackgate/ackgate/internal/testenv"
)

// push is one POST the emulator made.
type push struct {
	envelope map[string]any
	message  map[string]any
}

// endpoint records the emulator's pushes and answers them with the
// statuses given in turn, then 204.
type endpoint struct {
	mu       sync.Mutex
	statuses []int
	pushes   []push
	got      chan struct{}
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var env map[string]any
	_ = json.Unmarshal(b, &env)
	msg, _ := env["message"].(map[string]any)
	e.mu.Lock()
	e.pushes = append(e.pushes, push{env, msg})
	status := http.StatusNoContent
	if len(e.statuses) > 0 {
		status, e.statuses = e.statuses[0], e.statuses[1:]
	}
	e.mu.Unlock()
	w.WriteHeader(status)
	e.got <- struct{}{}
}

func (e *endpoint) snapshot() []push {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]push(nil), e.pushes...)
}

func start(t *testing.T) *emulator.Emulator {
	t.Helper()
	launcher, ok := emulator.Require(t)
	if !ok {
		return nil
	}
	var log testenv.SyncBuffer
	e, err := emulator.Start(context.Background(), launcher, &log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Stop()
		if t.Failed() {
			t.Logf("emulator log:\n%s", log.String())
		}
	})
	return e
}

// What the gateway relies on, and what docs/reliability.md and the package
// documentation say of the emulator, held against the emulator itself: the
// wrapped envelope with both spellings, a nack redelivered under the same
// message id, 203 counted as an ack, no deliveryAttempt in a push even
// with a dead-letter policy (pull has it), and a message that exhausts
// its attempts published to the dead-letter topic with its attributes.
// When an emulator release changes one of these, this test says which.
func TestEmulatorPushContract(t *testing.T) {
	t.Parallel()
	e := start(t)
	if e == nil {
		return
	}
	ctx := context.Background()
	ep := &endpoint{statuses: []int{http.StatusServiceUnavailable, 203}, got: make(chan struct{}, 100)}
	srv := httptest.NewServer(ep)
	t.Cleanup(srv.Close)

	const (
		topic = "projects/emu-test/topics/orders"
		sub   = "projects/emu-test/subscriptions/orders-push"
	)
	if err := e.CreateTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateSubscription(ctx, emulator.Subscription{Name: sub, Topic: topic, PushEndpoint: srv.URL + "/push",
		AckDeadline: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ids, err := e.Publish(ctx, topic, emulator.Message{Data: []byte("hello"), Attributes: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	// A 503, then the redelivery answered 203.
	testenv.Receive(t, ep.got, "the first push")
	testenv.Receive(t, ep.got, "the redelivery after a nack")
	pushes := ep.snapshot()
	for i, p := range pushes {
		m := p.message
		data, _ := base64.StdEncoding.DecodeString(m["data"].(string))
		switch {
		case m["messageId"] != ids[0] || m["message_id"] != ids[0]:
			t.Fatalf("push %d: message ids %v / %v, want %s in both spellings", i, m["messageId"], m["message_id"], ids[0])
		case m["publishTime"] == nil || m["publishTime"] != m["publish_time"]:
			t.Fatalf("push %d: publish times %v / %v", i, m["publishTime"], m["publish_time"])
		case string(data) != "hello" || m["attributes"].(map[string]any)["k"] != "v":
			t.Fatalf("push %d: data %q, attributes %v", i, data, m["attributes"])
		case p.envelope["subscription"] != sub:
			t.Fatalf("push %d: subscription %v", i, p.envelope["subscription"])
		case p.envelope["deliveryAttempt"] != nil:
			t.Fatalf("push %d carries deliveryAttempt %v without a dead-letter policy", i, p.envelope["deliveryAttempt"])
		}
	}

	// With a dead-letter policy: always refused, five attempts, then the
	// dead-letter topic.
	ep.mu.Lock()
	ep.statuses = []int{500, 500, 500, 500, 500, 500, 500, 500}
	ep.mu.Unlock()
	const (
		topic2 = "projects/emu-test/topics/payments"
		sub2   = "projects/emu-test/subscriptions/payments-push"
		dlq    = "projects/emu-test/topics/payments-dead"
		dlqSub = "projects/emu-test/subscriptions/payments-dead"
	)
	for _, tp := range []string{topic2, dlq} {
		if err := e.CreateTopic(ctx, tp); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.CreateSubscription(ctx, emulator.Subscription{Name: dlqSub, Topic: dlq, AckDeadline: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateSubscription(ctx, emulator.Subscription{Name: sub2, Topic: topic2, PushEndpoint: srv.URL + "/push",
		AckDeadline: 10 * time.Second, DeadLetterTopic: dlq, MaxDeliveryAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Publish(ctx, topic2, emulator.Message{Data: []byte("refused"), Attributes: map[string]string{"n": "1"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		testenv.Receive(t, ep.got, "push "+string(rune('1'+i))+" under the dead-letter policy")
	}
	for _, p := range ep.snapshot()[2:] {
		if p.envelope["deliveryAttempt"] != nil {
			t.Fatalf("a push under a dead-letter policy carries deliveryAttempt %v: the emulator changed; "+
				"update the package documentation and docs/reliability.md", p.envelope["deliveryAttempt"])
		}
	}
	var dead []emulator.Received
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		got, err := e.Pull(ctx, dlqSub, 10)
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, got...)
		return len(dead) > 0
	}, func() string { return "nothing reached the dead-letter topic after five refused pushes" })
	d := dead[0]
	if string(d.Data) != "refused" || d.Attributes["n"] != "1" || d.Attributes["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" {
		t.Fatalf("dead letter: data %q, attributes %v", d.Data, d.Attributes)
	}
	if err := e.Acknowledge(ctx, dlqSub, d.AckID); err != nil {
		t.Fatal(err)
	}
	if n := len(ep.snapshot()); n != 7 {
		t.Fatalf("%d pushes, want 2 + 5: the dead-lettered message was pushed again", n)
	}

	// A pull subscription under a dead-letter policy does carry
	// deliveryAttempt.
	if err := e.StopPushing(ctx, sub2); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Publish(ctx, topic2, emulator.Message{Data: []byte("pulled")}); err != nil {
		t.Fatal(err)
	}
	var pulled []emulator.Received
	testenv.Eventually(t, testenv.StepTimeout, func() bool {
		got, err := e.Pull(ctx, sub2, 10)
		if err != nil {
			t.Fatal(err)
		}
		pulled = append(pulled, got...)
		return len(pulled) > 0
	}, func() string { return "the pull subscription returned nothing" })
	if pulled[0].DeliveryAttempt != 1 || string(pulled[0].Data) != "pulled" {
		t.Fatalf("pulled %q with deliveryAttempt %d, want 1", pulled[0].Data, pulled[0].DeliveryAttempt)
	}
}
