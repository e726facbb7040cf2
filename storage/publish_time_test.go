package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Every way a delivery reaches the ledger (the claim that creates the
// operation, one that finds it open, one that finds it acknowledged, a
// conflict and its redelivery) keeps the broker's publish time beside the
// time it was received: each delivery its own, and none when the broker
// sent none.
func TestDeliveriesKeepThePublishTime(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	published := func(s int) *time.Time {
		p := t0.Add(time.Duration(-s) * time.Second)
		return &p
	}
	claim := func(op *gate.Operation, msg string, at time.Time, p *time.Time) {
		t.Helper()
		c := creating(t, op, msg, at)
		c.Claim.Delivery.PublishTime = p
		if _, _, err := l.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}

	op := newOperation("published")
	claim(op, "m-1", t0, published(90))                    // creates it
	claim(op, "m-1", t0.Add(time.Minute), published(90))   // finds it open
	claim(op, "m-2", t0.Add(2*time.Minute), nil)           // a broker that sent none
	claim(op, "m-3", t0.Add(3*time.Minute), published(30)) // another publication
	must(t, l.Write(ctx, confirm(t, op, "res-1", t0.Add(4*time.Minute))))
	must(t, l.Write(ctx, acked(t, op, 1, t0.Add(4*time.Minute))))
	claim(op, "m-1", t0.Add(5*time.Minute), published(90)) // finds it acknowledged

	rec := *op
	rec.Fingerprint = "v1:fp-other"
	rec.ID = gate.ConflictID(rec.ScopeKey, rec.Fingerprint)
	rec.CreatedAt = t0.Add(6 * time.Minute)
	for i, p := range []*time.Time{published(60), nil} {
		d := delivery("m-c", 0, t0.Add(time.Duration(6+i)*time.Minute))
		d.PublishTime = p
		if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: op, Record: &rec, Delivery: d, At: d.ReceivedAt}); err != nil {
			t.Fatal(err)
		}
	}

	check := func(id string, want []*time.Time) {
		t.Helper()
		ds := mustGet(t, l, id).Deliveries
		if len(ds) != len(want) {
			t.Fatalf("%s: %d deliveries, want %d", id, len(ds), len(want))
		}
		for i, w := range want {
			got := ds[i].PublishTime
			if (got == nil) != (w == nil) || (got != nil && !got.Equal(*w)) || ds[i].ReceivedAt.Before(t0) {
				t.Errorf("%s delivery %d: publish time %v, received %v; want published %v", id, ds[i].N, got, ds[i].ReceivedAt, w)
			}
		}
	}
	check(op.ID, []*time.Time{published(90), published(90), nil, published(30), published(90)})
	check(rec.ID, []*time.Time{published(60), nil})
}
