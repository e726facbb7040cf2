package handlers

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

func TestAdmissionSlots(t *testing.T) {
	t.Parallel()
	if a := newAdmission(0, 0, 1<<20, time.Second); a != nil {
		t.Fatal("no bound must build no admission")
	}
	var none *admission
	if tk, ok := none.enter(context.Background()); !ok || !tk.reserve(context.Background(), withLength(1<<20)) {
		t.Fatal("no bound must admit everything")
	}
	a := newAdmission(1, 0, 1<<20, 0)
	first, ok := a.enter(context.Background())
	if !ok {
		t.Fatal("the first delivery found no slot")
	}
	if _, ok := a.enter(context.Background()); ok {
		t.Fatal("a second delivery got a slot past the bound")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := newAdmission(1, 0, 1<<20, time.Minute).enter(ctx); !ok {
		t.Fatal("a free slot must be taken even by a request that is going away")
	}
	// A waiter takes the slot as soon as it is left.
	b := newAdmission(1, 0, 1<<20, time.Minute)
	held, _ := b.enter(context.Background())
	got := make(chan bool, 1)
	go func() {
		tk, ok := b.enter(context.Background())
		tk.leave()
		got <- ok
	}()
	held.leave()
	if !<-got {
		t.Fatal("a waiting delivery did not get the slot that was left")
	}
	// A waiter whose request goes away gives up.
	held, _ = b.enter(context.Background())
	wctx, wcancel := context.WithCancel(context.Background())
	gaveUp := make(chan bool, 1)
	go func() {
		_, ok := b.enter(wctx)
		gaveUp <- !ok
	}()
	wcancel()
	if !<-gaveUp {
		t.Fatal("a waiter whose request ended still got a slot")
	}
	held.leave()
	first.leave()
	if tk, ok := a.enter(context.Background()); !ok {
		t.Fatal("a slot left was not free again")
	} else {
		tk.leave()
	}
}

// The byte bound counts what each admitted body holds: its declared length,
// or the largest body until one of unknown length has been read.
func TestAdmissionBodyBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newAdmission(0, 100, 60, 0)
	one, _ := a.enter(ctx)
	if !one.reserve(ctx, withLength(60)) {
		t.Fatal("a body within the budget was refused")
	}
	two, _ := a.enter(ctx)
	if two.reserve(ctx, withLength(41)) {
		t.Fatal("a body past the budget was admitted (60 + 41 > 100)")
	}
	if !two.reserve(ctx, withLength(40)) {
		t.Fatal("a body that fits the rest of the budget was refused")
	}
	// An empty body, or one over the body limit (refused later with 413),
	// reserves nothing.
	three, _ := a.enter(ctx)
	if !three.reserve(ctx, withLength(0)) || !three.reserve(ctx, withLength(61)) || three.held != 0 {
		t.Fatalf("an empty or oversized body reserved %d bytes", three.held)
	}
	one.leave()
	// Unknown length: the largest body is reserved, and the rest given back
	// once the body is read.
	four, _ := a.enter(ctx)
	if !four.reserve(ctx, withLength(-1)) || four.held != 60 {
		t.Fatalf("a body of unknown length reserved %d bytes, want 60", four.held)
	}
	four.fit(10)
	if four.held != 10 {
		t.Fatalf("after reading 10 bytes the body holds %d", four.held)
	}
	five, _ := a.enter(ctx)
	if !five.reserve(ctx, withLength(50)) {
		t.Fatal("the bytes given back by fit were not free (40 + 10 + 50 = 100)")
	}
	for _, tk := range []*ticket{&two, &three, &four, &five} {
		tk.leave()
	}
	if !a.bytes.TryAcquire(100) {
		t.Fatal("the budget was not whole again after every delivery left")
	}
	// A budget smaller than one body of the largest size still admits one.
	small := newAdmission(0, 10, 60, 0)
	tk, _ := small.enter(ctx)
	if !tk.reserve(ctx, withLength(60)) {
		t.Fatal("a budget below the body limit refused a body of the largest size")
	}
}

func TestAtCapacityPerBroker(t *testing.T) {
	t.Parallel()
	for b, want := range map[gate.Broker]int{gate.BrokerPubSub: http.StatusTooManyRequests, gate.BrokerSNS: http.StatusServiceUnavailable} {
		out := atCapacity(b)
		if out.decision != gate.Nack || statusFor(out) != want {
			t.Errorf("%s: %s %d, want a nack answered %d", b, out.decision, statusFor(out), want)
		}
	}
}

func withLength(n int64) *http.Request {
	return &http.Request{ContentLength: n}
}
