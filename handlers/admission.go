package handlers

import (
	"context"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// admission bounds how many deliveries this process works on at once. A
// delivery inside the gate holds its request and decoded message, a
// downstream connection, a lease renewer and the goroutines serving them; with
// no bound the process's memory follows the brokers' concurrency instead of
// its own capacity. A delivery past the bound waits for a slot before its body
// is read, so a waiting request costs little more than its connection; if no
// slot frees within the wait it is answered with a nack, which is always
// safe: the broker sends the message again. A nil admission admits all.
type admission struct {
	slots chan struct{}
	wait  time.Duration
}

func newAdmission(maxInFlight int, wait time.Duration) *admission {
	if maxInFlight <= 0 {
		return nil
	}
	return &admission{slots: make(chan struct{}, maxInFlight), wait: wait}
}

// enter takes a slot, waiting at most a.wait and no longer than ctx lives. A
// true answer must be paired with leave.
func (a *admission) enter(ctx context.Context) bool {
	if a == nil {
		return true
	}
	select {
	case a.slots <- struct{}{}:
		return true
	default:
	}
	if a.wait <= 0 {
		return false
	}
	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (a *admission) leave() {
	if a != nil {
		<-a.slots
	}
}

// atCapacity is the answer to a delivery that found no slot: a nack, 503 with
// Retry-After for both brokers.
func atCapacity() outcome {
	return outcome{decision: gate.Nack, reason: "gateway at its limit of deliveries in flight; the broker will redeliver"}
}
