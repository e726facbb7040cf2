package soak

import (
	"testing"

	"github.com/ackgate/ackgate/internal/emulator"
)

// The short soak through Google's Pub/Sub emulator: it chooses the message
// ids, builds the envelope and redelivers by its own rules. Without a
// dead-letter policy nothing but an ack ever stops a message, so every
// route dead-letters at the gateway, and the run ends only if everything
// the gateway parked was settled by the reconciler or the operator; then
// the emulator must hold nothing. Duplicates are the publisher's: the same
// key and payload under a second message id.
func TestShortSoakEmulator(t *testing.T) {
	t.Parallel()
	launcher, ok := emulator.Require(t)
	if !ok {
		return
	}
	cfg := ShortConfig()
	cfg.Broker, cfg.EmulatorLauncher, cfg.EmulatorDeadLetter = BrokerEmulator, launcher, false
	rep := runShort(t, cfg)
	if rep.Broker.Acked != rep.Publications || rep.Broker.DeadLettered != 0 || rep.Held != 0 {
		t.Fatalf("the emulator acked %d of %d publications, dead-lettered %d, still held %d: without a dead-letter policy every one must be acked",
			rep.Broker.Acked, rep.Publications, rep.Broker.DeadLettered, rep.Held)
	}
	if rep.Republished == 0 {
		t.Fatal("the publisher published nothing twice: the run proved nothing of duplicates")
	}
}

// The same through subscriptions with a dead-letter policy (five
// deliveries), many poisoned messages and no operator: what the gateway
// refuses on the route that leaves dead letters to the broker ends on the
// emulator's dead-letter topic, and each such message is in the ledger
// with its reason. The emulator's pushes carry no deliveryAttempt even
// then (internal/emulator's contract test pins that); the gateway works
// without it.
func TestShortSoakEmulatorDeadLetter(t *testing.T) {
	t.Parallel()
	launcher, ok := emulator.Require(t)
	if !ok {
		return
	}
	cfg := ShortConfig()
	cfg.Broker, cfg.EmulatorLauncher, cfg.EmulatorDeadLetter = BrokerEmulator, launcher, true
	cfg.Messages, cfg.MaxDeliveryAttempts, cfg.PoisonRate, cfg.OperatorEvery = 150, 5, 0.2, 0
	rep := runShort(t, cfg)
	if rep.Broker.DeadLettered == 0 || rep.Broker.Acked+rep.Broker.DeadLettered != rep.Publications || rep.Held != 0 {
		t.Fatalf("the emulator acked %d and dead-lettered %d of %d publications, still held %d: want some dead-lettered and every one settled",
			rep.Broker.Acked, rep.Broker.DeadLettered, rep.Publications, rep.Held)
	}
}
