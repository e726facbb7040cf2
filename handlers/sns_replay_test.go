package handlers_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/internal/authtest"
)

// A captured genuine SubscriptionConfirmation replayed ten times makes one
// ConfirmSubscription call and one record. The replays are answered 204: the
// message has been handled, and a genuine retry by SNS (whose first answer
// was lost) must hear "delivered", not a rejection.
func TestSNSReplayedConfirmationIsConfirmedOnce(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newSNSEnv(t, sns)
	c := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-1"), "2")
	for i := range 10 {
		r, _ := e.postSNS("orders", c, authtest.Body(c), nil)
		if r.Status != http.StatusNoContent {
			t.Fatalf("copy %d: status %d (%s), want 204", i+1, r.Status, r.Raw)
		}
	}
	if got := sns.Confirms(); len(got) != 1 {
		t.Fatalf("10 copies made %d ConfirmSubscription calls, want 1", len(got))
	}
	if ev := e.subscriptionEvents("orders"); len(ev) != 1 || ev[0].Outcome != adminapi.SubscriptionConfirmed {
		t.Fatalf("10 copies recorded %+v, want one confirmed event", ev)
	}

	// Ten copies at once: still one call. A copy that arrives while another
	// is confirming is a nack (503), so that SNS would ask again later.
	c2 := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-2"), "1")
	var wg sync.WaitGroup
	statuses := make(chan int, 10)
	for range 10 {
		wg.Go(func() {
			r, _ := e.postSNS("orders", c2, authtest.Body(c2), nil)
			statuses <- r.Status
		})
	}
	wg.Wait()
	close(statuses)
	acked := 0
	for s := range statuses {
		switch s {
		case http.StatusNoContent:
			acked++
		case http.StatusServiceUnavailable:
		default:
			t.Fatalf("concurrent copy answered %d", s)
		}
	}
	if acked == 0 {
		t.Fatal("no concurrent copy was acked")
	}
	if got := sns.Confirms(); len(got) != 2 {
		t.Fatalf("ConfirmSubscription calls: %d, want 2", len(got))
	}
	if ev := e.subscriptionEvents("orders"); len(ev) != 2 {
		t.Fatalf("recorded %d events, want 2", len(ev))
	}
}

// A confirmation whose signed Timestamp is older than the bound is refused
// (403, which SNS does not retry) without a ConfirmSubscription call, and
// recorded once, however often it is replayed.
func TestSNSStaleConfirmationIsRefused(t *testing.T) {
	t.Parallel()
	sns := authtest.NewSNS(t)
	e := newSNSEnv(t, sns)
	old := sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-old")
	old.Timestamp = time.Now().Add(-2 * time.Hour).UTC().Format("2006-01-02T15:04:05.000Z")
	sns.Sign(old, "2")
	for i := range 5 {
		r, _ := e.postSNS("orders", old, authtest.Body(old), nil)
		if r.Status != http.StatusForbidden {
			t.Fatalf("copy %d of a two-hour-old confirmation: status %d (%s), want 403", i+1, r.Status, r.Raw)
		}
	}
	if got := sns.Confirms(); len(got) != 0 {
		t.Fatalf("a stale confirmation was confirmed: %v", got)
	}
	ev := e.subscriptionEvents("orders")
	if len(ev) != 1 || ev[0].Outcome != adminapi.SubscriptionRefused || ev[0].MessageID != "c-old" {
		t.Fatalf("recorded %+v, want one refusal of c-old", ev)
	}
	// A fresh confirmation is still confirmed.
	fresh := sns.Sign(sns.Confirmation(brokerauth.SNSSubscriptionConfirmation, ordersTopic, "c-new"), "2")
	if r, _ := e.postSNS("orders", fresh, authtest.Body(fresh), nil); r.Status != http.StatusNoContent {
		t.Fatalf("fresh confirmation: %d (%s)", r.Status, r.Raw)
	}
}
