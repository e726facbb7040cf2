package storage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/storage"
)

func TestSubscriptionEvents(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	subs := storage.NewSubscriptions(pool)
	ctx := context.Background()
	const topic = "arn:aws:sns:us-east-1:123456789012:orders"
	events := []adminapi.SubscriptionEvent{
		{Route: "r", TopicArn: topic, MessageType: "SubscriptionConfirmation", MessageID: "m1",
			Outcome: adminapi.SubscriptionConfirmFailed, Reason: "HTTP 503", ReceivedAt: t0},
		{Route: "r", TopicArn: topic, MessageType: "SubscriptionConfirmation", MessageID: "m1",
			Outcome: adminapi.SubscriptionConfirmed, SubscriptionArn: topic + ":s1", ReceivedAt: t0},
		{Route: "r", TopicArn: topic, MessageType: "UnsubscribeConfirmation", MessageID: "m2",
			Outcome: adminapi.SubscriptionRecorded, ReceivedAt: t0},
		{Route: "other", TopicArn: topic, MessageType: "SubscriptionConfirmation", MessageID: "m3",
			Outcome: adminapi.SubscriptionRefused, ReceivedAt: t0},
	}
	for i := range events {
		if err := subs.Record(ctx, &events[i]); err != nil || events[i].ID == 0 {
			t.Fatalf("record %d: id %d, %v", i, events[i].ID, err)
		}
	}
	got, err := subs.List(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 3 && got[1].ReceivedAt.Equal(t0) {
		got[1].ReceivedAt = events[1].ReceivedAt // same instant, maybe another *Location
	}
	if len(got) != 3 || got[1] != events[1] || got[2].Outcome != adminapi.SubscriptionRecorded {
		t.Fatalf("list = %+v", got)
	}
	// The schema refuses outcomes and types it does not know.
	bad := adminapi.SubscriptionEvent{Route: "r", TopicArn: topic, MessageType: "Notification", MessageID: "m4",
		Outcome: adminapi.SubscriptionRecorded, ReceivedAt: t0}
	if err := subs.Record(ctx, &bad); !errors.Is(err, storage.ErrRefused) {
		t.Fatalf("a Notification recorded as a subscription event: %v", err)
	}
}

// A subscription message is claimed by its first copy; later copies learn
// that it is being handled, then how it was settled. A confirmation that
// failed gives the claim up for the broker's retry, and a claim whose owner
// died is taken over once its lease has passed.
func TestSubscriptionClaims(t *testing.T) {
	t.Parallel()
	_, pool := newLedger(t)
	subs := storage.NewSubscriptions(pool)
	ctx := context.Background()
	const topic = "arn:aws:sns:us-east-1:123456789012:orders"
	event := func(id, outcome string) *adminapi.SubscriptionEvent {
		return &adminapi.SubscriptionEvent{Route: "r", TopicArn: topic, MessageType: "SubscriptionConfirmation",
			MessageID: id, Outcome: outcome, Reason: outcome + " here", ReceivedAt: t0}
	}
	claim := func(id string) adminapi.SubscriptionClaim {
		t.Helper()
		c, err := subs.Claim(ctx, "r", id, 30*time.Second)
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		return c
	}

	first := claim("m1")
	if !first.Owned {
		t.Fatal("first copy does not own its claim")
	}
	if c := claim("m1"); c.Owned || c.Outcome != "" {
		t.Fatalf("second copy while the first is handling it: %+v", c)
	}
	if c, _ := subs.Claim(ctx, "other", "m1", 30*time.Second); !c.Owned {
		t.Fatal("the same message id on another route is another message")
	}
	// Failed now: given up, so the retry owns it again.
	if err := subs.Settle(ctx, first, event("m1", adminapi.SubscriptionConfirmFailed)); err != nil {
		t.Fatal(err)
	}
	retry := claim("m1")
	if !retry.Owned {
		t.Fatal("a failed confirmation's retry cannot claim it")
	}
	if err := subs.Settle(ctx, retry, event("m1", adminapi.SubscriptionConfirmed)); err != nil {
		t.Fatal(err)
	}
	if c := claim("m1"); c.Owned || c.Outcome != adminapi.SubscriptionConfirmed || c.Reason != "confirmed here" {
		t.Fatalf("copy after confirmation: %+v", c)
	}
	if err := subs.Settle(ctx, claim("m1"), event("m1", adminapi.SubscriptionConfirmed)); err == nil {
		t.Fatal("a copy that does not own the claim settled it")
	}

	// An owner that died: its claim lapses after the lease.
	dead := claim("m2")
	if _, err := pool.Exec(ctx, `UPDATE sns_subscription_claims SET claimed_at = now() - interval '1 minute' WHERE message_id = 'm2'`); err != nil {
		t.Fatal(err)
	}
	heir := claim("m2")
	if !heir.Owned {
		t.Fatal("a lapsed claim was not taken over")
	}
	if err := subs.Settle(ctx, heir, event("m2", adminapi.SubscriptionRefused)); err != nil {
		t.Fatal(err)
	}
	// The dead owner's late answer is recorded, and changes nothing.
	if err := subs.Settle(ctx, dead, event("m2", adminapi.SubscriptionConfirmed)); err != nil {
		t.Fatal(err)
	}
	if c := claim("m2"); c.Owned || c.Outcome != adminapi.SubscriptionRefused {
		t.Fatalf("after the late answer: %+v", c)
	}
	got, err := subs.List(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("recorded %d events, want 4 (m1 failed and confirmed, m2 refused and the late confirmation)", len(got))
	}
}
