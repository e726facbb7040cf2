package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// Every way a delivery reaches the ledger (a claim, a delivery that changed
// nothing, a conflict) keeps the broker's publish time beside the time it
// was received, and a delivery without one keeps none.
func TestDeliveriesKeepThePublishTime(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t)
	ctx := context.Background()
	published := t0.Add(-90 * time.Second)

	op := newOperation("published")
	w := gate.Claiming(nil, op, gate.Lease{Owner: "owner-a", Fence: 1, Expires: t0.Add(30 * time.Second)},
		withPublishTime(delivery("m-1", t0), published), "trace-1")
	must(t, l.Write(ctx, gate.StartChange(w, steps(t, "", gate.StateReceived, gate.StateReserved, gate.StatePendingEffect),
		&gate.Attempt{N: 1, Kind: gate.AttemptEffect, IdempotencyKey: op.IdempotencyKey, Fence: 1, StartedAt: t0}, "new", t0)))

	again := withPublishTime(delivery("m-1", t0.Add(time.Minute)), published)
	again.OperationID = op.ID
	must(t, l.RecordDelivery(ctx, again))
	none := delivery("m-2", t0.Add(2*time.Minute))
	none.OperationID = op.ID
	must(t, l.RecordDelivery(ctx, none))

	rec := *op
	rec.Fingerprint = "v1:fp-other"
	rec.ID = gate.ConflictID(rec.ScopeKey, rec.Fingerprint)
	if _, err := l.RecordConflict(ctx, &gate.Conflict{Original: op, Record: &rec,
		Delivery: withPublishTime(delivery("m-1", t0.Add(3*time.Minute)), published), At: t0.Add(3 * time.Minute)}); err != nil {
		t.Fatal(err)
	}

	ds := mustGet(t, l, op.ID).Deliveries
	if len(ds) != 3 {
		t.Fatalf("%d deliveries, want 3", len(ds))
	}
	for i, want := range []*time.Time{&published, &published, nil} {
		got := ds[i].PublishTime
		if (got == nil) != (want == nil) || (got != nil && !got.Equal(*want)) || !ds[i].ReceivedAt.After(published) {
			t.Errorf("delivery %d: publish time %v, received %v; want %v", i, got, ds[i].ReceivedAt, want)
		}
	}
	cd := mustGet(t, l, rec.ID).Deliveries
	if len(cd) != 1 || cd[0].PublishTime == nil || !cd[0].PublishTime.Equal(published) {
		t.Fatalf("conflict delivery %+v, want publish time %v", cd, published)
	}
}

func withPublishTime(d *gate.Delivery, at time.Time) *gate.Delivery {
	d.PublishTime = &at
	return d
}
