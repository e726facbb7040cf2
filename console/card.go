package console

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
)

// The evidence card draws one operation's record as the path it took, left
// to right: deliveries, intent, reservation and fence, (handoff,) attempts,
// authoritative evidence, committed state, ack. The indeterminate branch
// and the terminal / dead-letter branch hang below the attempts when the
// operation took them. Every node is built from the record's rows only: a
// node the record cannot back is drawn as not reached, never as done.

// Node statuses, also CSS classes.
const (
	statusDone    = "done"    // the record shows this step happened
	statusOpen    = "open"    // not reached (yet)
	statusWarn    = "warn"    // reached, and waiting for someone
	statusBad     = "bad"     // reached, and ended the operation without success
	statusSkipped = "skipped" // never part of this operation's path
)

type node struct {
	// Key names the node for tests and anchors (data-node).
	Key    string
	Title  string
	Status string
	Time   *time.Time
	// Since is the time from the step before (the node to the left, or the
	// one a branch drops from) to this one, drawn on the edge into it; ""
	// when either end has no time.
	Since  string
	Fields []field
	// Items are repeated entries: each delivery, each attempt.
	Items []item
	Note  string
}

type field struct {
	K, V string
	// Mono draws ids and fingerprints in a fixed-width face.
	Mono bool
	// Link, when set, makes V a link (the trace viewer).
	Link string
}

type item struct {
	Title  string
	Status string
	Fields []field
}

type card struct {
	Main          []node
	Indeterminate *node
	Terminal      *node
}

func at(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (c *Console) traceLink(id string) string {
	if id == "" || c.o.TraceURL == "" {
		return ""
	}
	return strings.ReplaceAll(c.o.TraceURL, "{trace_id}", id)
}

// firstEvent is the first log entry into state s, or nil.
func firstEvent(rec *adminapi.Record, s gate.State) *adminapi.Event {
	for i := range rec.Events {
		if rec.Events[i].To == s {
			return &rec.Events[i]
		}
	}
	return nil
}

func eventsInto(rec *adminapi.Record, s gate.State) []adminapi.Event {
	var out []adminapi.Event
	for _, e := range rec.Events {
		if e.To == s {
			out = append(out, e)
		}
	}
	return out
}

func (c *Console) buildCard(rec *adminapi.Record) card {
	op := &rec.Operation
	var cd card

	// Deliveries.
	dn := node{Key: "deliveries", Title: fmt.Sprintf("Deliveries (%d)", len(rec.Deliveries)), Status: statusDone}
	if len(rec.Deliveries) > 0 {
		dn.Time = at(rec.Deliveries[0].ReceivedAt)
	} else {
		dn.Status = statusOpen
	}
	for i, d := range rec.Deliveries {
		it := item{Title: fmt.Sprintf("#%d %s", i+1, d.Broker), Status: statusDone, Fields: []field{
			{K: "message id", V: d.MessageID, Mono: true},
			{K: "received", V: stamp(&d.ReceivedAt)},
		}}
		if d.PublishTime != nil {
			it.Fields = append(it.Fields, field{K: "published", V: stamp(d.PublishTime)})
		}
		if d.BrokerAttempt > 0 {
			it.Fields = append(it.Fields, field{K: "broker attempt", V: strconv.Itoa(d.BrokerAttempt)})
		}
		dec := string(d.Decision)
		if dec == "" {
			dec = "(not answered yet)"
		}
		it.Fields = append(it.Fields, field{K: "answer", V: dec})
		if d.Reason != "" {
			it.Fields = append(it.Fields, field{K: "why", V: d.Reason})
		}
		if d.Anomaly != "" {
			it.Status = statusWarn
			it.Fields = append(it.Fields, field{K: "anomaly", V: d.Anomaly})
		}
		if d.TraceID != "" {
			it.Fields = append(it.Fields, field{K: "trace", V: d.TraceID, Mono: true, Link: c.traceLink(d.TraceID)})
		}
		dn.Items = append(dn.Items, it)
	}
	cd.Main = append(cd.Main, dn)

	// Intent.
	in := node{Key: "intent", Title: "Intent", Status: statusDone, Time: at(op.CreatedAt), Fields: []field{
		{K: "operation", V: op.ID, Mono: true},
		{K: "route", V: op.Route},
		{K: "key (" + string(op.KeySource) + ")", V: op.Key, Mono: true},
		{K: "fingerprint v" + strconv.Itoa(op.FingerprintVersion), V: op.Fingerprint, Mono: true},
		{K: "contract", V: op.ContractVersion, Mono: true},
		{K: "shape", V: string(op.Shape)},
	}}
	if op.ConflictOf != "" {
		in.Status = statusBad
		in.Note = "A conflict record: this key was already taken by another payload. Never executed."
		in.Fields = append(in.Fields, field{K: "conflict of", V: op.ConflictOf, Mono: true, Link: "/console/operations/" + op.ConflictOf})
	}
	cd.Main = append(cd.Main, in)

	// Reservation and fence.
	rn := node{Key: "reservation", Title: "Reservation and fence", Status: statusOpen}
	if reserved := eventsInto(rec, gate.StateReserved); len(reserved) > 0 {
		rn.Status, rn.Time = statusDone, at(reserved[0].At)
		for _, e := range reserved {
			rn.Items = append(rn.Items, item{Title: "fence " + strconv.FormatInt(e.Fence, 10), Status: statusDone,
				Fields: []field{{K: "reserved", V: stamp(&e.At)}}})
		}
	}
	if op.Fence > 0 {
		rn.Status = statusDone
		rn.Fields = append(rn.Fields,
			field{K: "fence now", V: strconv.FormatInt(op.Fence, 10), Mono: true},
			field{K: "owner", V: op.Owner, Mono: true},
			field{K: "lease", V: stamp(op.LeaseStart) + " → " + stamp(op.LeaseDeadline)},
			field{K: "extensions", V: strconv.Itoa(op.LeaseExtensions)})
		if op.LeaseLostAt != nil {
			rn.Status = statusWarn
			rn.Fields = append(rn.Fields, field{K: "lease lost", V: stamp(op.LeaseLostAt)})
		}
	}
	if op.ConflictOf != "" {
		rn.Status = statusSkipped
	}
	cd.Main = append(cd.Main, rn)

	// Handoff: only for operations that were committed with an outbox entry.
	if op.HandedOffAt != nil {
		cd.Main = append(cd.Main, node{Key: "handoff", Title: "Handed off (outbox)", Status: statusDone, Time: op.HandedOffAt,
			Fields: []field{{K: "publication id", V: op.IdempotencyKey, Mono: true}},
			Note:   "Committed with its outbox entry; the broker was acked here, before the effect."})
	}

	// Attempts.
	an := node{Key: "attempts", Title: fmt.Sprintf("Attempts (%d)", len(rec.Attempts)), Status: statusOpen,
		Fields: []field{{K: "idempotency key", V: op.IdempotencyKey, Mono: true}}}
	if len(rec.Attempts) > 0 {
		an.Status, an.Time = attemptsStatus(rec.Attempts), at(rec.Attempts[0].StartedAt)
	}
	for _, a := range rec.Attempts {
		it := item{Title: fmt.Sprintf("#%d %s", a.N, a.Kind), Status: outcomeStatus(a.Outcome), Fields: []field{
			{K: "idempotency key", V: a.IdempotencyKey, Mono: true},
			{K: "fence", V: strconv.FormatInt(a.Fence, 10), Mono: true},
			{K: "started", V: stamp(&a.StartedAt)},
			{K: "finished", V: stamp(a.FinishedAt)},
		}}
		outcome := string(a.Outcome)
		if outcome == "" {
			outcome = "no result recorded"
		}
		if a.StatusCode != 0 {
			outcome += " (HTTP " + strconv.Itoa(a.StatusCode) + ")"
		}
		it.Fields = append(it.Fields, field{K: "outcome", V: outcome})
		if a.ResultID != "" {
			it.Fields = append(it.Fields, field{K: "result id", V: a.ResultID, Mono: true})
		}
		if a.Reason != "" {
			it.Fields = append(it.Fields, field{K: "why", V: a.Reason})
		}
		an.Items = append(an.Items, it)
	}
	if op.ConflictOf != "" {
		an.Status = statusSkipped
	}
	cd.Main = append(cd.Main, an)

	// Authoritative evidence.
	en := node{Key: "evidence", Title: "Authoritative evidence", Status: statusOpen}
	if op.EvidenceAt != nil || op.State.Confirmed() {
		en.Status, en.Time = statusDone, op.EvidenceAt
		rid := op.ResultID
		if rid == "" {
			rid = "(none: status code only)"
		}
		en.Fields = append(en.Fields, field{K: "result id", V: rid, Mono: true}, field{K: "recorded", V: stamp(op.EvidenceAt)})
	}
	cd.Main = append(cd.Main, en)

	// Committed state.
	cn := node{Key: "committed", Title: "Committed state", Status: statusOpen,
		Fields: []field{{K: "state now", V: string(op.State)}, {K: "fence", V: strconv.FormatInt(op.Fence, 10), Mono: true}}}
	if e := firstEvent(rec, gate.StateEffectConfirmed); e != nil {
		cn.Status, cn.Time = statusDone, at(e.At)
		cn.Fields = append(cn.Fields, field{K: "effect_confirmed", V: stamp(&e.At)})
	}
	cd.Main = append(cd.Main, cn)

	// Ack.
	ak := node{Key: "ack", Title: "Ack", Status: statusOpen}
	switch {
	case op.AckedAt != nil:
		ak.Status, ak.Time = statusDone, op.AckedAt
		ak.Fields = append(ak.Fields, field{K: "written to broker", V: stamp(op.AckedAt)})
	case op.State == gate.StateAckPending:
		ak.Status = statusWarn
		ak.Note = "Confirmed; the ack was not seen going out. A redelivery is acked without a new effect."
	}
	for _, d := range rec.Deliveries {
		if d.Decision == gate.Ack {
			ak.Fields = append(ak.Fields, field{K: "acked delivery", V: d.MessageID + " at " + stamp(&d.ReceivedAt), Mono: true})
			if ak.Status == statusOpen {
				// Acked without confirmed evidence: a dead letter taken out of
				// circulation, drawn on the terminal branch.
				ak.Status = statusSkipped
			}
		}
	}
	cd.Main = append(cd.Main, ak)

	// The indeterminate branch.
	if ind := eventsInto(rec, gate.StateEffectIndeterminate); len(ind) > 0 {
		b := &node{Key: "indeterminate", Title: "Indeterminate", Status: statusDone, Time: at(ind[0].At)}
		if op.State == gate.StateEffectIndeterminate {
			b.Status = statusWarn
			b.Note = "Automatic re-execution is blocked until this is settled."
			b.Fields = append(b.Fields, field{K: "lane", V: laneOr(op.Lane)})
			if op.NextCheckAt != nil {
				b.Fields = append(b.Fields, field{K: "next lookup", V: stamp(op.NextCheckAt)})
			}
		}
		for _, e := range ind {
			b.Items = append(b.Items, item{Title: "entered at fence " + strconv.FormatInt(e.Fence, 10), Status: statusWarn,
				Fields: []field{{K: "at", V: stamp(&e.At)}, {K: "why", V: e.Reason}}})
		}
		cd.Indeterminate = b
	}

	// The terminal / dead-letter branch.
	term := eventsInto(rec, gate.StateTerminalFailure)
	if len(term) > 0 || len(rec.DeadLetters) > 0 {
		b := &node{Key: "terminal", Title: "Terminal / dead letter", Status: statusDone,
			Fields: []field{{K: "dead-letter policy", V: string(op.DeadLetterPolicy)}}}
		if op.State == gate.StateTerminalFailure {
			b.Status = statusBad
		}
		for _, e := range term {
			if b.Time == nil {
				b.Time = at(e.At)
			}
			b.Items = append(b.Items, item{Title: "terminal at fence " + strconv.FormatInt(e.Fence, 10), Status: statusBad,
				Fields: []field{{K: "at", V: stamp(&e.At)}, {K: "why", V: e.Reason}}})
		}
		for _, dl := range rec.DeadLetters {
			if b.Time == nil {
				b.Time = at(dl.At)
			}
			b.Items = append(b.Items, item{Title: "dead-lettered by the gateway", Status: statusBad,
				Fields: []field{{K: "at", V: stamp(&dl.At)}, {K: "why", V: dl.Reason}}})
		}
		cd.Terminal = b
	}
	cd.edges()
	return cd
}

// edges writes on each edge the time its step took: from the latest time
// to the left of a node (or, for a branch, the latest time on the path
// before the branch's) to the node's own.
func (cd *card) edges() {
	var prev *time.Time
	var path []*time.Time
	for i := range cd.Main {
		n := &cd.Main[i]
		if n.Time != nil {
			if prev != nil {
				n.Since = duration(n.Time.Sub(*prev))
			}
			prev = n.Time
			path = append(path, n.Time)
		}
	}
	for _, b := range []*node{cd.Indeterminate, cd.Terminal} {
		if b == nil || b.Time == nil {
			continue
		}
		var before *time.Time
		for _, t := range path {
			if !t.After(*b.Time) && (before == nil || t.After(*before)) {
				before = t
			}
		}
		if before != nil {
			b.Since = duration(b.Time.Sub(*before))
		}
	}
}

// duration is a step's length as an operator compares them: milliseconds
// below a minute, whole seconds above.
func duration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Millisecond:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// attemptsStatus colours the attempts node by what the attempts show: done
// only when one of them confirmed the effect; red when the newest ended
// terminally; amber while the newest failed in a way that may be retried or
// left the effect unknown, or never finished.
func attemptsStatus(as []gate.Attempt) string {
	for _, a := range as {
		if a.Outcome == gate.OutcomeConfirmed {
			return statusDone
		}
	}
	return outcomeStatus(as[len(as)-1].Outcome)
}

func outcomeStatus(o gate.Outcome) string {
	switch o {
	case gate.OutcomeConfirmed:
		return statusDone
	case gate.OutcomeTerminal:
		return statusBad
	}
	// Retryable, unknown, absent (a lookup that found nothing), or no
	// outcome recorded: someone or something still has to act.
	return statusWarn
}

func laneOr(l string) string {
	if l == "" {
		return "operator"
	}
	return l
}

func stamp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}
