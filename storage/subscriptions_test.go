package storage_test

import (
	"context"
	"errors"
	"testing"

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
