package soak

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// The checker works on three independent records of one run and trusts none
// of them alone: what the broker saw (Intent), what the downstream applied
// (Effect), and what the gateway's ledger says (LedgerOp). It is a pure
// function so that each invariant can be shown to fire on made-up records.

// Intent is one published payload: a message id with its data. A key reused
// with a changed payload is a second Intent under the same message id.
type Intent struct {
	Route     string
	MessageID string
	// Variant is 0 for the first payload published under the message id, 1
	// for a changed one.
	Variant int
	// TraceID is the trace the publisher attached to the message; the gateway
	// continues it, so the ledger's delivery rows carry it.
	TraceID    string
	BodySHA256 string
	// Acked: the broker received an ack for it. DeadLettered: the broker's
	// own dead-letter policy took it after its last nacked delivery.
	// StillDelivered: neither, when the run stopped waiting for the broker.
	Acked          bool
	DeadLettered   bool
	StillDelivered bool
}

func (i Intent) name() string { return fmt.Sprintf("%s/%s#%d", i.Route, i.MessageID, i.Variant) }

// Effect is one effect the downstream applied (not a deduplicated replay).
type Effect struct {
	Route      string
	Key        string
	ResultID   string
	BodySHA256 string
}

// KeyReuse is a deduplicating downstream seeing a key again with a different
// body: a changed payload sent under an existing idempotency key.
type KeyReuse struct{ Route, Key string }

// LedgerOp is an operation or conflict record as the ledger holds it.
type LedgerOp struct {
	ID             string
	Route          string
	Key            string
	IdempotencyKey string
	State          string
	ResultID       string
	ConflictOf     string
	Reason         string
	// Attempts counts the effect attempts recorded for it.
	Attempts int
	// DeadLetter is the reason in the gateway's dead-letter table; "" when it
	// has no dead letter.
	DeadLetter string
	// HandedOff: the operation committed with an outbox entry (the moment a
	// handoff route acks). Outbox: the entry exists. OutboxDelivered: the
	// relay's sweep emptied it once the effect was evidenced.
	HandedOff, Outbox, OutboxDelivered bool
	// Lanes is its way through the lanes as the admin API shows it; nil
	// for an operation that took its effect at the first call untouched
	// (see readLanes).
	Lanes *OpLanes
}

// LocalRow is one row the local route's statement wrote, read from the
// route's own table: the local shape's record of its effects.
type LocalRow struct {
	Route       string
	ID          string
	Key         string
	OperationID string
	BodySHA256  string
}

// Inputs are the three records.
type Inputs struct {
	Intents  []Intent
	Effects  []Effect
	KeyReuse []KeyReuse
	Ops      map[string]LedgerOp
	// TraceOps maps a trace id to the ids of the records whose delivery rows
	// carry it.
	TraceOps map[string][]string
	// Shapes maps a route to its shape; only handoff and local matter.
	Shapes map[string]string
	// LocalRows are the local route's rows: its effects, each of which must
	// have committed with its operation's evidence.
	LocalRows []LocalRow
	// Dedupe names the routes whose provider deduplicates by key.
	Dedupe map[string]bool
	// OperatorActions are the resolutions and replays the admin API
	// applied for the soak's operator; LanesRead says Ops carry Lanes.
	OperatorActions []OperatorAction
	LanesRead       bool
	// Held are publications the broker still held once the run was done
	// with them (the emulator's backlog after the last ack).
	Held []Intent
}

// Accounting sorts every intent into the one place it ended up.
type Accounting struct {
	// AckedWithEvidence: acked, and the ledger's result id is an effect the
	// downstream applied for this very payload.
	AckedWithEvidence int
	// DeadLettered: acked because the gateway dead-lettered it with a reason.
	DeadLettered int
	// The lanes of intents not acked, each known to the ledger.
	Indeterminate, Terminal, Conflicting, Pending int
	// ConfirmedUnacked: the effect is confirmed with evidence but the broker
	// gave up before an ack reached it.
	ConfirmedUnacked int
	// AckedUnrecorded: acked, while no delivery in the ledger carries this
	// publication, and a twin (another publication of the same route, key
	// and payload) is on a record that justifies the ack: confirmed with
	// the downstream's effect for that payload, or dead-lettered. A
	// delivery answered from an operation's existing evidence is recorded
	// after the answer, best effort: a publisher's duplicate (its own
	// message id and trace) answered while Postgres is down, or just
	// before the gateway dies, is acked rightly and recorded nowhere.
	AckedUnrecorded int
	// Orphans are ledger records no published message's delivery points at.
	Orphans int

	// Handoff payloads the broker was acked for at the handoff, by what the
	// relay made of them: confirmed with the downstream's evidence, parked
	// in the indeterminate lane, terminal with a dead letter, or still open
	// when the run ended (each of those is also an invariant violation).
	HandedOffConfirmed, HandedOffParked, HandedOffTerminal, HandedOffOpen int
	// Outbox entries not emptied at the end, by their operation's state:
	// parked and terminal ones keep their message for a replay; confirmed
	// ones wait for the next sweep; open ones were still the relay's.
	OutboxParked, OutboxTerminal, OutboxConfirmed, OutboxOpen int
	// LocalCommitted: acked local payloads with exactly one row, written in
	// the commit that confirmed their operation (also in AckedWithEvidence).
	// LocalRows counts the rows in the local table.
	LocalCommitted, LocalRows int

	// Who settled what the gateway could not settle alone, by operation:
	// the reconciler's lookup took it out of the indeterminate lane;
	// operators resolved it (by kind) or replayed it, and how the replays
	// ended; a handoff's relay found a lost answer's effect with the
	// lookup, or settled it by retrying under the same key inside the
	// provider's dedupe window.
	SettledByReconciler                                      int
	ResolvedHappened, ResolvedNotHappened, ResolvedAbandoned int
	Replayed, ReplayedConfirmed, ReplayedTerminal            int
	HandoffByLookup, HandoffByDedupe                         int
}

// Invariant is one count that must be zero, with a few examples when not.
type Invariant struct {
	Name     string
	Count    int
	Examples []string
}

// Verdict is the checker's answer.
type Verdict struct {
	Accounting
	TwoEffects, AcksWithoutEffect, ConflictsExecuted, Unaccounted Invariant
	HandoffsWithoutOutbox, HandoffsOpen, LocalRowsWithoutEvidence Invariant
	NeverSettled, OperatorUnrecorded                              Invariant
}

// Invariants lists them in a fixed order: the four every shape answers to,
// then those of the handoff and local shapes, then the broker's and the
// operator's.
func (v *Verdict) Invariants() []Invariant {
	return []Invariant{v.TwoEffects, v.AcksWithoutEffect, v.ConflictsExecuted, v.Unaccounted,
		v.HandoffsWithoutOutbox, v.HandoffsOpen, v.LocalRowsWithoutEvidence, v.NeverSettled, v.OperatorUnrecorded}
}

// Violations is the sum of the invariants.
func (v *Verdict) Violations() int {
	n := 0
	for _, inv := range v.Invariants() {
		n += inv.Count
	}
	return n
}

const maxExamples = 5

// findings collects offending items by id, so one incident found two ways is
// counted once.
type findings map[string]string

func (f findings) add(id, format string, args ...any) {
	if _, ok := f[id]; !ok {
		f[id] = fmt.Sprintf(format, args...)
	}
}

func (f findings) invariant(name string) Invariant {
	inv := Invariant{Name: name, Count: len(f)}
	ids := make([]string, 0, len(f))
	for id := range f {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids[:min(len(ids), maxExamples)] {
		inv.Examples = append(inv.Examples, f[id])
	}
	return inv
}

// State classes, by what the gateway answers for them.
var (
	confirmedStates = []string{"effect_confirmed", "ack_pending", "acknowledged"}
	pendingStates   = []string{"received", "reserved", "pending_effect"}
)

// Check computes the invariants.
//
//   - keys with two effects: a (route, idempotency key) the downstream applied
//     more than once, or one payload applied under two keys. A deduplicating
//     downstream's replays are not applications, so for the idempotent shape
//     this counts distinct applications; for a downstream without dedupe every
//     call that applied counts.
//   - acks without an effect: an intent acked (or recorded as confirmed, which
//     the next delivery acks) while the downstream has no effect with the
//     ledger's result id for that payload, or while the ledger shows neither
//     confirmed evidence nor a dead letter.
//   - conflicts executed: a changed payload under a reused key that reached the
//     downstream beside the original, a conflict record that moved past
//     conflicting or has attempts or a result, a changed payload sent under
//     the original's idempotency key, or one payload answered from two records.
//   - messages not accounted for: an intent the ledger does not know, or knows
//     only in a lane without a reason.
//   - handoffs acked without an outbox entry: a handoff payload acked while
//     its operation has no committed outbox entry, so no relay would ever
//     deliver it.
//   - handoffs left open: a handoff payload acked whose operation, after the
//     relay's drain, is neither confirmed, parked nor terminal.
//   - local rows without evidence: a row of the local table whose operation
//     is unknown, of another key, or not confirmed with that very row as its
//     result. The local table's rows are effects like the downstream's, so
//     a second row for one key is a key with two effects and an acked local
//     payload without its row is an ack without an effect.
//   - messages never settled: a publication the broker was still
//     delivering when the run stopped waiting for it, or one it still held
//     once the run was done (the emulator's backlog): a message that would
//     be pushed for ever.
//   - operator actions not recorded: a resolution or replay the admin API
//     answered 200 for, with no intervention of that kind on that operation
//     in its record.
func Check(in Inputs) Verdict {
	var v Verdict
	two, noEffect, conflicts, lost := findings{}, findings{}, findings{}, findings{}
	noOutbox, open, rowsAlone := findings{}, findings{}, findings{}
	unsettled, unrecorded := findings{}, findings{}

	effects := slices.Clone(in.Effects)
	for _, lr := range in.LocalRows {
		effects = append(effects, Effect{Route: lr.Route, Key: lr.Key, ResultID: lr.ID, BodySHA256: lr.BodySHA256})
	}
	v.LocalRows = len(in.LocalRows)

	byKey := map[string][]Effect{}
	keysBySHA := map[string]map[string]bool{}
	for _, e := range effects {
		k := e.Route + " " + e.Key
		byKey[k] = append(byKey[k], e)
		if keysBySHA[e.BodySHA256] == nil {
			keysBySHA[e.BodySHA256] = map[string]bool{}
		}
		keysBySHA[e.BodySHA256][k] = true
	}
	for k, apps := range byKey {
		if len(apps) > 1 {
			two.add("key "+k, "route %s key %s applied %d times", apps[0].Route, apps[0].Key, len(apps))
		}
	}
	for sha, keys := range keysBySHA {
		if len(keys) > 1 {
			two.add("body "+sha, "one payload (sha256 %.12s) applied under %d keys", sha, len(keys))
		}
	}

	linked := map[string]bool{}
	groups := map[string][]Intent{}
	twins := map[string]string{} // route, key and payload -> a record one of its publications is on
	for _, it := range in.Intents {
		if ids := slices.Compact(slices.Sorted(slices.Values(in.TraceOps[it.TraceID]))); len(ids) == 1 {
			twins[it.Route+" "+it.MessageID+" "+it.BodySHA256] = ids[0]
		}
	}
	for _, it := range in.Intents {
		groups[it.Route+" "+it.MessageID] = append(groups[it.Route+" "+it.MessageID], it)
		ids := slices.Compact(slices.Sorted(slices.Values(in.TraceOps[it.TraceID])))
		for _, id := range ids {
			linked[id] = true
		}
		switch {
		case len(ids) > 1:
			conflicts.add("intent "+it.name(), "%s was answered from %d records: %s", it.name(), len(ids), strings.Join(ids, ", "))
			continue
		case len(ids) == 0 || in.Ops[ids[0]].ID == "":
			if it.Acked && twinJustifies(in.Ops[twins[it.Route+" "+it.MessageID+" "+it.BodySHA256]], it, byKey) {
				v.AckedUnrecorded++
			} else if it.Acked {
				noEffect.add("intent "+it.name(), "%s acked, and the ledger has no record of it", it.name())
			} else {
				lost.add("intent "+it.name(), "%s: the ledger has no record of it", it.name())
			}
			continue
		}
		op := in.Ops[ids[0]]
		if in.Shapes[it.Route] == shapeHandoff && it.Acked && op.ConflictOf == "" {
			handedOff(&v, it, op, byKey, noEffect, lost, noOutbox, open)
			continue
		}
		switch {
		case slices.Contains(confirmedStates, op.State):
			if !appliedFor(byKey[op.Route+" "+op.IdempotencyKey], op.ResultID, it.BodySHA256) {
				noEffect.add("intent "+it.name(), "%s: ledger %s is %s with result %q, which the downstream never applied for this payload",
					it.name(), op.ID, op.State, op.ResultID)
			} else if it.Acked {
				v.AckedWithEvidence++
				if in.Shapes[it.Route] == shapeLocal && len(byKey[op.Route+" "+op.IdempotencyKey]) == 1 {
					v.LocalCommitted++
				}
			} else {
				v.ConfirmedUnacked++
			}
		case it.Acked && op.DeadLetter != "" && (op.State == "terminal_failure" || op.State == "conflicting"):
			v.DeadLettered++
		case it.Acked:
			noEffect.add("intent "+it.name(), "%s acked while ledger %s is %s without a dead letter", it.name(), op.ID, op.State)
		case op.Reason == "" && !slices.Contains(pendingStates, op.State):
			lost.add("intent "+it.name(), "%s: ledger %s is %s without a reason", it.name(), op.ID, op.State)
		case op.State == "effect_indeterminate":
			v.Indeterminate++
		case op.State == "terminal_failure":
			v.Terminal++
		case op.State == "conflicting":
			v.Conflicting++
		case slices.Contains(pendingStates, op.State):
			v.Pending++
		default:
			lost.add("intent "+it.name(), "%s: ledger %s is in unknown state %q", it.name(), op.ID, op.State)
		}
	}

	for g, intents := range groups {
		applied := map[string]bool{}
		for _, it := range intents {
			if keysBySHA[it.BodySHA256] != nil {
				applied[it.name()] = true
			}
		}
		if len(applied) > 1 {
			conflicts.add("group "+g, "%s: %d payloads under one key were applied", g, len(applied))
		}
	}
	for _, op := range in.Ops {
		if !linked[op.ID] {
			v.Orphans++
		}
		if op.ConflictOf == "" {
			continue
		}
		if op.Attempts > 0 || op.ResultID != "" || (op.State != "received" && op.State != "conflicting") {
			conflicts.add("record "+op.ID, "conflict record %s is %s with %d attempts and result %q", op.ID, op.State, op.Attempts, op.ResultID)
		}
	}
	for _, kr := range in.KeyReuse {
		conflicts.add("reuse "+kr.Route+" "+kr.Key, "route %s: key %s was sent again with a different payload", kr.Route, kr.Key)
	}
	for _, op := range in.Ops {
		if !op.Outbox || op.OutboxDelivered {
			continue
		}
		switch {
		case slices.Contains(confirmedStates, op.State):
			v.OutboxConfirmed++
		case op.State == "effect_indeterminate":
			v.OutboxParked++
		case op.State == "terminal_failure":
			v.OutboxTerminal++
		default:
			v.OutboxOpen++
		}
	}
	for _, lr := range in.LocalRows {
		op, ok := in.Ops[lr.OperationID]
		switch {
		case !ok:
			rowsAlone.add("row "+lr.ID, "local row %s (key %s) names operation %s, which the ledger does not have", lr.ID, lr.Key, lr.OperationID)
		case op.Route != lr.Route || op.IdempotencyKey != lr.Key:
			rowsAlone.add("row "+lr.ID, "local row %s has key %s, and its operation %s is %s/%s", lr.ID, lr.Key, op.ID, op.Route, op.IdempotencyKey)
		case !slices.Contains(confirmedStates, op.State) || op.ResultID != lr.ID:
			rowsAlone.add("row "+lr.ID, "local row %s (key %s): operation %s is %s with result %q", lr.ID, lr.Key, op.ID, op.State, op.ResultID)
		}
	}

	v.TwoEffects = two.invariant("keys with two effects")
	v.AcksWithoutEffect = noEffect.invariant("acks without an effect")
	v.ConflictsExecuted = conflicts.invariant("conflicts executed")
	v.Unaccounted = lost.invariant("messages not accounted for")
	v.HandoffsWithoutOutbox = noOutbox.invariant("handoff acks without an outbox entry")
	v.HandoffsOpen = open.invariant("handoffs left open")
	for _, it := range in.Intents {
		if it.StillDelivered {
			unsettled.add("intent "+it.name()+" "+it.TraceID, "%s was still being delivered when the run stopped waiting", it.name())
		}
	}
	for _, it := range in.Held {
		unsettled.add("held "+it.name()+" "+it.TraceID, "%s was still held by the broker after the run was done with it", it.name())
	}
	lanes(&v, in, unrecorded)

	v.LocalRowsWithoutEvidence = rowsAlone.invariant("local rows without evidence")
	v.NeverSettled = unsettled.invariant("messages never settled")
	v.OperatorUnrecorded = unrecorded.invariant("operator actions not recorded")
	return v
}

// lanes counts who settled what, and finds the operator's actions that the
// ledger does not show.
func lanes(v *Verdict, in Inputs, unrecorded findings) {
	if !in.LanesRead {
		return
	}
	for _, a := range in.OperatorActions {
		op := in.Ops[a.OperationID]
		found := false
		if op.Lanes != nil {
			for _, iv := range op.Lanes.Interventions {
				found = found || iv.Kind == a.Kind
			}
		}
		if !found {
			unrecorded.add(a.OperationID+" "+a.Kind, "operation %s: the operator's %s was answered 200, and its record has no such intervention", a.OperationID, a.Kind)
		}
	}
	for _, op := range in.Ops {
		l := op.Lanes
		if l == nil {
			continue
		}
		byOperator, replayed := 0, false
		for _, iv := range l.Interventions {
			switch iv.Kind {
			case "happened":
				v.ResolvedHappened++
			case "not_happened":
				v.ResolvedNotHappened++
			case "abandon":
				v.ResolvedAbandoned++
			case "replay":
				replayed = true
			}
			if iv.From == "effect_indeterminate" {
				byOperator++
			}
		}
		if l.IndeterminateExits > byOperator {
			v.SettledByReconciler++
		}
		if replayed {
			v.Replayed++
			switch {
			case slices.Contains(confirmedStates, op.State):
				v.ReplayedConfirmed++
			case op.State == "terminal_failure":
				v.ReplayedTerminal++
			}
		}
		if in.Shapes[op.Route] != shapeHandoff || !slices.Contains(confirmedStates, op.State) {
			continue
		}
		switch {
		case l.LookupFound:
			v.HandoffByLookup++
		case in.Dedupe[op.Route] && l.RetriedUnknown:
			v.HandoffByDedupe++
		}
	}
}

// handedOff sorts a handoff payload the broker acked. The ack promised an
// operation with an outbox entry; what follows is the relay's: the effect
// confirmed by the downstream, the operation parked or terminal with a dead
// letter, each with a reason, and nothing still open after the drain.
func handedOff(v *Verdict, it Intent, op LedgerOp, byKey map[string][]Effect, noEffect, lost, noOutbox, open findings) {
	if !op.HandedOff || !op.Outbox {
		noOutbox.add("intent "+it.name(), "%s acked, and ledger %s (%s) has handed_off=%t, outbox entry=%t",
			it.name(), op.ID, op.State, op.HandedOff, op.Outbox)
		return
	}
	switch {
	case slices.Contains(confirmedStates, op.State):
		if !appliedFor(byKey[op.Route+" "+op.IdempotencyKey], op.ResultID, it.BodySHA256) {
			noEffect.add("intent "+it.name(), "%s: handed off, ledger %s is %s with result %q, which the downstream never applied for this payload",
				it.name(), op.ID, op.State, op.ResultID)
			return
		}
		v.HandedOffConfirmed++
	case slices.Contains(pendingStates, op.State):
		v.HandedOffOpen++
		open.add("intent "+it.name(), "%s: handed off, ledger %s is still %s after the relay's drain", it.name(), op.ID, op.State)
	case op.Reason == "":
		lost.add("intent "+it.name(), "%s: handed off, ledger %s is %s without a reason", it.name(), op.ID, op.State)
	case op.State == "effect_indeterminate":
		v.HandedOffParked++
	case op.State == "terminal_failure" && op.DeadLetter != "":
		v.HandedOffTerminal++
	case op.State == "terminal_failure":
		lost.add("intent "+it.name(), "%s: handed off and acked, ledger %s is terminal without a dead letter", it.name(), op.ID)
	default:
		lost.add("intent "+it.name(), "%s: handed off, ledger %s is in state %q", it.name(), op.ID, op.State)
	}
}

// twinJustifies reports whether op, the record of another publication of
// its route, key and payload, justifies acking it: confirmed with the
// downstream's effect for that payload, or dead-lettered.
func twinJustifies(op LedgerOp, it Intent, byKey map[string][]Effect) bool {
	switch {
	case op.ID == "":
		return false
	case slices.Contains(confirmedStates, op.State):
		return appliedFor(byKey[op.Route+" "+op.IdempotencyKey], op.ResultID, it.BodySHA256)
	}
	return op.DeadLetter != "" && (op.State == "terminal_failure" || op.State == "conflicting")
}

// appliedFor reports whether one of a key's effects carries the result id and
// was applied for the payload with that digest.
func appliedFor(effects []Effect, resultID, sha string) bool {
	for _, e := range effects {
		if e.ResultID == resultID && e.BodySHA256 == sha {
			return true
		}
	}
	return false
}
