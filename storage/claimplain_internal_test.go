package storage

import (
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// A claim batch goes as the plain statement unless one of its claims
// records a dead letter or an outbox entry as it creates its operation: the
// plain statement writes neither, the full one both. (That the full one is
// what then runs is held end to end by the dead-letter and outbox tests,
// which find their rows.)
func TestClaimSideRowsChooseTheStatement(t *testing.T) {
	t.Parallel()
	for _, q := range []struct {
		name string
		sql  string
		side bool
	}{{"claim", claimSQL.sql, true}, {"plain claim", claimPlainSQL.sql, false}} {
		for _, insert := range []string{"INSERT INTO dead_letters", "INSERT INTO outbox", "INSERT INTO deliveries"} {
			want := q.side || insert == "INSERT INTO deliveries"
			if got := strings.Contains(q.sql, insert); got != want {
				t.Errorf("%s: contains %q: %v, want %v", q.name, insert, got, want)
			}
		}
	}

	at := time.Now()
	claim := func(name string) *gate.Change { return benchCreating(benchOperation(name, at), at) }
	dead := claim("dead")
	dead.DeadLetter = &gate.DeadLetter{OperationID: dead.OperationID, Reason: "no usable identity", At: at}
	handoff := claim("handoff")
	handoff.Outbox = &gate.OutboxEntry{OperationID: handoff.OperationID, Route: "r", PublicationID: "pub-1",
		Message: &gate.Message{Data: []byte("{}")}, CreatedAt: at, NextAttemptAt: at}
	l := NewLedger(nil)
	for _, tc := range []struct {
		name  string
		batch []*gate.Change
		side  bool
	}{
		{"plain claims", []*gate.Change{claim("a"), claim("b")}, false},
		{"one dead letter among them", []*gate.Change{claim("c"), dead}, true},
		{"one handoff among them", []*gate.Change{handoff, claim("d")}, true},
	} {
		args := newClaimArgs(len(tc.batch), l.texts)
		for _, c := range tc.batch {
			if err := args.add(l, c); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		if got := args.sideRows(); got != tc.side {
			t.Errorf("%s: side rows %v, want %v", tc.name, got, tc.side)
		}
	}
}
