package handlers

import (
	"context"
	"testing"
	"time"
)

func TestAdmissionSlots(t *testing.T) {
	t.Parallel()
	if a := newAdmission(0, time.Second); a != nil || !a.enter(context.Background()) {
		t.Fatal("no bound must admit everything")
	}
	a := newAdmission(1, 10*time.Millisecond)
	if !a.enter(context.Background()) {
		t.Fatal("the first delivery found no slot")
	}
	if a.enter(context.Background()) {
		t.Fatal("a second delivery got a slot past the bound")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if a.enter(ctx) {
		t.Fatal("a delivery whose request is gone got a slot")
	}
	// A waiter takes the slot as soon as it is left.
	got := make(chan bool, 1)
	b := newAdmission(1, time.Minute)
	b.enter(context.Background())
	go func() { got <- b.enter(context.Background()) }()
	b.leave()
	if !<-got {
		t.Fatal("a waiting delivery did not get the slot that was left")
	}
	a.leave()
	if !a.enter(context.Background()) {
		t.Fatal("a slot left was not free again")
	}
}
