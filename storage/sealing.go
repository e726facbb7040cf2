package storage

import (
	"errors"
	"fmt"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/seal"
)

// Sealer keeps the values a handoff route lists as private (JSON pointers
// into the message's data) sealed while they wait in the outbox, bound to
// their operation and pointer, so that a copy of the ledger (a backup, a
// replica, a dump handed to support) does not carry them in clear.
// internal/seal's Keyring is one.
type Sealer interface {
	// Seal returns doc with the value at each pointer sealed for context;
	// Unseal returns the document Seal was given, byte for byte.
	Seal(doc []byte, pointers []string, context string) ([]byte, error)
	Unseal(doc []byte, pointers []string, context string) ([]byte, error)
	// SealBytes and OpenBytes do the same for a whole value: data that is
	// not JSON (Seal answers seal.ErrNotJSON), whose private values cannot
	// be found in it.
	SealBytes(plain []byte, context string) string
	OpenBytes(sealed, context string) ([]byte, error)
	// CurrentID names the key new values are sealed with.
	CurrentID() string
}

// SealOutbox has the ledger seal the outbox's private values with s.
func SealOutbox(s Sealer) LedgerOption { return func(l *Ledger) { l.sealer = s } }

// sealedEntry is an outbox entry's data as the outbox keeps it, and how it
// was sealed: sealedWith is the key's id (nil: kept in clear, for the route
// lists no private pointer), pointers the values sealed (none: the whole
// data, which was not JSON).
type sealedEntry struct {
	data       []byte
	sealedWith *string
	pointers   []string
}

func (l *Ledger) sealEntry(e *gate.OutboxEntry) (sealedEntry, error) {
	data := nonNilBytes(e.Message.Data)
	if len(e.Private) == 0 {
		return sealedEntry{data: data}, nil
	}
	if l.sealer == nil {
		// Start-up refuses such a route without a key; this is the last
		// line, so that a private value never waits in clear.
		return sealedEntry{}, fmt.Errorf("storage: outbox: route %s lists private values and no outbox key is set", e.Route)
	}
	key := l.sealer.CurrentID()
	sealed, err := l.sealer.Seal(data, e.Private, e.OperationID)
	if err == nil {
		return sealedEntry{data: sealed, sealedWith: &key, pointers: e.Private}, nil
	}
	// Data that is not JSON has no values to find: it is sealed whole.
	// Any other failure (a malformed pointer) is refused rather than kept
	// in clear.
	if !errors.Is(err, seal.ErrNotJSON) {
		return sealedEntry{}, fmt.Errorf("storage: outbox: sealing %s: %w", e.OperationID, err)
	}
	return sealedEntry{data: []byte(l.sealer.SealBytes(data, e.OperationID)), sealedWith: &key, pointers: []string{}}, nil
}

// openEntry is the data the relay delivers, from what the outbox keeps.
func (l *Ledger) openEntry(id string, s sealedEntry) ([]byte, error) {
	if s.sealedWith == nil {
		return s.data, nil
	}
	if l.sealer == nil {
		return nil, fmt.Errorf("outbox entry %s was sealed with key %q and no outbox key is set", id, *s.sealedWith)
	}
	if len(s.pointers) == 0 {
		return l.sealer.OpenBytes(string(s.data), id)
	}
	return l.sealer.Unseal(s.data, s.pointers, id)
}
