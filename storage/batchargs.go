package storage

// The statements' arguments: what group commit (groupcommit.go) sends for
// a batch, one typed array per column with one element per step, built
// with as few allocations as the arrays allow.

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ackgate/ackgate/gate"
)

// micro cuts t to the microsecond Postgres keeps, so what the gate holds
// and what the ledger stores compare equal.
func micro(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

func textOrNull(s string, set bool) *string {
	if !set {
		return nil
	}
	return &s
}

// carve points each of cols at its own n-element stretch of one backing
// array. A statement's arrays are built by append, one element per step;
// from nil, each of the fifty-odd columns would allocate, and reallocate as
// it grows, so a batch paid hundreds of allocations before pgx encoded a
// byte (the largest source of allocations in the gateway under load).
// Carved, it pays one per element type. Each stretch is capped at n, so a
// column that outgrows it moves out instead of writing into its neighbour.
func carve[T any](n int, cols ...*[]T) {
	buf := make([]T, n*len(cols))
	for i, c := range cols {
		*c = buf[i*n : i*n : (i+1)*n]
	}
}

// times keeps the time values a statement's nullable timestamp columns
// point to, n to a backing array, instead of one allocation per pointer.
// A pointer stays valid when append moves the array: the old one is kept
// alive by it.
type times []time.Time

func (ts *times) at(t time.Time) *time.Time {
	*ts = append(*ts, micro(t))
	return &(*ts)[len(*ts)-1]
}

func (ts *times) ptr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	return ts.at(*t)
}

// claimArgs are the claim statement's arrays, one element per creating
// claim.
type claimArgs struct {
	id, route, tenant, keySource, key, scopeKey, fingerprint, shape, deadLetterPolicy []string
	contractVersion, idempotencyKey, traceID, spanID, broker, source, messageID       []string
	owner, state, reason, d1Decision, d1Reason                                        []string
	ackedDecision, ackedReason, ackedAnomaly, outboxOrderingKey                       []string
	createdAt, retainUntil, leaseDeadline                                             []time.Time
	publishTime, a1StartedAt                                                          []*time.Time
	fingerprintVersion, brokerAttempt                                                 []int
	handedOff                                                                         []bool
	deadReason, outboxPublicationID                                                   []*string
	outboxAttributes, outboxSealedPointers                                            [][]byte
	outboxData                                                                        [][]byte
	outboxSealedWith                                                                  []*string
	times                                                                             times
	texts
}

// newClaimArgs has room for n claims, whose text columns go to pgx as t says.
func newClaimArgs(n int, t texts) claimArgs {
	a := claimArgs{texts: t}
	carve(n, &a.id, &a.route, &a.tenant, &a.keySource, &a.key, &a.scopeKey, &a.fingerprint, &a.shape,
		&a.deadLetterPolicy, &a.contractVersion, &a.idempotencyKey, &a.traceID, &a.spanID, &a.broker,
		&a.source, &a.messageID, &a.owner, &a.state, &a.reason, &a.d1Decision, &a.d1Reason,
		&a.ackedDecision, &a.ackedReason, &a.ackedAnomaly, &a.outboxOrderingKey)
	carve(n, &a.createdAt, &a.retainUntil, &a.leaseDeadline)
	carve(n, &a.publishTime, &a.a1StartedAt)
	carve(n, &a.fingerprintVersion, &a.brokerAttempt)
	carve(n, &a.handedOff)
	carve(n, &a.deadReason, &a.outboxPublicationID, &a.outboxSealedWith)
	carve(n, &a.outboxAttributes, &a.outboxSealedPointers, &a.outboxData)
	a.times = make(times, 0, 2*n)
	return a
}

func (a *claimArgs) add(l *Ledger, c *gate.Change) error {
	// What can fail comes first, so that a refused claim adds nothing.
	var (
		pub, ordering   string
		attrs, pointers []byte
		sealed          sealedEntry
		hasOutbox       = c.Outbox != nil
	)
	if hasOutbox {
		m := c.Outbox.Message
		pub, ordering = c.Outbox.PublicationID, m.OrderingKey
		var err error
		if attrs, err = json.Marshal(m.Attributes); err != nil {
			return fmt.Errorf("storage: claim: outbox attributes: %w", err)
		}
		if sealed, err = l.sealEntry(c.Outbox); err != nil {
			return err
		}
		if sealed.sealedWith != nil {
			if pointers, err = json.Marshal(sealed.pointers); err != nil {
				return fmt.Errorf("storage: claim: outbox pointers: %w", err)
			}
		}
	}
	r, d, at := c.Claim.Row, c.Claim.Delivery, micro(orNow(c.At))
	a.id = append(a.id, r.ID)
	a.route = append(a.route, r.Route)
	a.tenant = append(a.tenant, r.Tenant)
	a.keySource = append(a.keySource, string(r.KeySource))
	a.key = append(a.key, r.Key)
	a.scopeKey = append(a.scopeKey, r.ScopeKey)
	a.fingerprint = append(a.fingerprint, r.Fingerprint)
	a.shape = append(a.shape, string(r.Shape))
	a.deadLetterPolicy = append(a.deadLetterPolicy, string(r.DeadLetterPolicy))
	a.contractVersion = append(a.contractVersion, r.ContractVersion)
	a.idempotencyKey = append(a.idempotencyKey, r.IdempotencyKey)
	a.traceID = append(a.traceID, d.TraceID)
	a.spanID = append(a.spanID, r.SpanID)
	a.broker = append(a.broker, string(d.Broker))
	a.source = append(a.source, d.Source)
	a.messageID = append(a.messageID, d.MessageID)
	a.owner = append(a.owner, c.Claim.Owner)
	a.state = append(a.state, string(c.Steps[len(c.Steps)-1].To))
	a.reason = append(a.reason, c.Reason)
	a.d1Decision = append(a.d1Decision, string(d.Decision))
	a.d1Reason = append(a.d1Reason, d.Reason)
	var acked gate.Answer
	if c.Claim.AckedAnswer != nil {
		acked = *c.Claim.AckedAnswer
	}
	a.ackedDecision = append(a.ackedDecision, string(acked.Decision))
	a.ackedReason = append(a.ackedReason, acked.Reason)
	a.ackedAnomaly = append(a.ackedAnomaly, acked.Anomaly)
	a.createdAt = append(a.createdAt, at)
	a.retainUntil = append(a.retainUntil, micro(r.RetainUntil))
	a.leaseDeadline = append(a.leaseDeadline, micro(c.Claim.LeaseDeadline))
	a.publishTime = append(a.publishTime, a.times.ptr(d.PublishTime))
	var started *time.Time
	if c.Start != nil {
		started = a.times.at(at)
	}
	a.a1StartedAt = append(a.a1StartedAt, started)
	a.fingerprintVersion = append(a.fingerprintVersion, r.FingerprintVersion)
	a.brokerAttempt = append(a.brokerAttempt, d.BrokerAttempt)
	a.handedOff = append(a.handedOff, c.Outbox != nil)
	var dead *string
	if c.DeadLetter != nil {
		dead = &c.DeadLetter.Reason
	}
	a.deadReason = append(a.deadReason, dead)
	a.outboxPublicationID = append(a.outboxPublicationID, textOrNull(pub, hasOutbox))
	a.outboxOrderingKey = append(a.outboxOrderingKey, ordering)
	a.outboxAttributes = append(a.outboxAttributes, attrs)
	a.outboxData = append(a.outboxData, sealed.data)
	a.outboxSealedWith = append(a.outboxSealedWith, sealed.sealedWith)
	a.outboxSealedPointers = append(a.outboxSealedPointers, pointers)
	return nil
}

// sideRows reports whether a claim of the batch records a dead letter or
// an outbox entry as it creates its operation, which the plain claim
// statement cannot.
func (a *claimArgs) sideRows() bool {
	for i := range a.deadReason {
		if a.deadReason[i] != nil || a.outboxPublicationID[i] != nil {
			return true
		}
	}
	return false
}

func (a *claimArgs) named() pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{
		"id": a.of(a.id), "created_at": a.createdAt, "retain_until": a.retainUntil, "publish_time": a.publishTime,
		"fingerprint_version": a.fingerprintVersion, "broker_attempt": a.brokerAttempt, "route": a.of(a.route),
		"tenant": a.of(a.tenant), "key_source": a.of(a.keySource), "key": a.of(a.key), "scope_key": a.of(a.scopeKey),
		"fingerprint": a.of(a.fingerprint), "shape": a.of(a.shape), "dead_letter_policy": a.of(a.deadLetterPolicy),
		"contract_version": a.of(a.contractVersion), "idempotency_key": a.of(a.idempotencyKey), "trace_id": a.of(a.traceID),
		"span_id": a.of(a.spanID), "broker": a.of(a.broker), "source": a.of(a.source), "message_id": a.of(a.messageID),
		"owner": a.of(a.owner), "lease_deadline": a.leaseDeadline, "state": a.of(a.state), "reason": a.of(a.reason),
		"a1_started_at": a.a1StartedAt, "d1_decision": a.of(a.d1Decision), "d1_reason": a.of(a.d1Reason),
		"handed_off": a.handedOff, "dead_reason": a.ofNull(a.deadReason), "acked_decision": a.of(a.ackedDecision),
		"acked_reason": a.of(a.ackedReason), "acked_anomaly": a.of(a.ackedAnomaly),
		"outbox_publication_id": a.ofNull(a.outboxPublicationID), "outbox_ordering_key": a.of(a.outboxOrderingKey),
		"outbox_attributes": a.outboxAttributes, "outbox_data": a.outboxData,
		"outbox_sealed_with": a.ofNull(a.outboxSealedWith), "outbox_sealed_pointers": a.outboxSealedPointers,
	}
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// changeArgs are the change statement's arrays, one element per change,
// and its steps flattened beside them (step_i names the change).
type changeArgs struct {
	i, steps, leaseExtensions, deliveryN, answerN, finishN, finishStatus  []int
	startN, lookupN, lookupStatus, grant, checks                          []int
	id, expect                                                            []string
	messageID, answerDecision, answerReason, finishOutcome                []string
	finishResultID, finishReason, contract, lookupOutcome, lookupResultID []string
	lookupReason                                                          []string
	fence                                                                 []int64
	takes, logs, claims, settles, evidence, acked, handedOff, schedule    []bool
	at, leaseDeadline                                                     []*time.Time
	leaseLostAt, finishedAt, startedAt, lookupStartedAt                   []*time.Time
	lookupFinishedAt, nextCheckAt                                         []*time.Time
	final, reason, owner, resultID, lane, deadReason                      []*string
	intervention, actor, interventionReason, interventionResultID         []*string
	reset                                                                 []bool

	stepI, stepK                 []int
	stepFrom, stepTo, stepReason []string

	times times
	texts
}

// newChangeArgs has room for n changes and their steps, whose text columns
// go to pgx as t says.
func newChangeArgs(n, steps int, t texts) changeArgs {
	a := changeArgs{texts: t}
	carve(n, &a.i, &a.steps, &a.leaseExtensions, &a.deliveryN, &a.answerN, &a.finishN, &a.finishStatus,
		&a.startN, &a.lookupN, &a.lookupStatus, &a.grant, &a.checks)
	carve(n, &a.id, &a.expect, &a.messageID, &a.answerDecision, &a.answerReason, &a.finishOutcome,
		&a.finishResultID, &a.finishReason, &a.contract, &a.lookupOutcome, &a.lookupResultID, &a.lookupReason)
	carve(n, &a.fence)
	carve(n, &a.takes, &a.logs, &a.claims, &a.settles, &a.evidence, &a.acked, &a.handedOff, &a.schedule, &a.reset)
	carve(n, &a.at, &a.leaseDeadline, &a.leaseLostAt, &a.finishedAt, &a.startedAt, &a.lookupStartedAt,
		&a.lookupFinishedAt, &a.nextCheckAt)
	carve(n, &a.final, &a.reason, &a.owner, &a.resultID, &a.lane, &a.deadReason, &a.intervention, &a.actor,
		&a.interventionReason, &a.interventionResultID)
	carve(steps, &a.stepI, &a.stepK)
	carve(steps, &a.stepFrom, &a.stepTo, &a.stepReason)
	a.times = make(times, 0, 3*n)
	return a
}

// common says whether c is one of the common path's own changes, which an
// operation without a log records in its row alone: the holder's evidence
// from pending_effect, and the ack mark from ack_pending. Every other
// change is appended to the log.
func common(c *gate.Change) bool {
	switch c.Kind {
	case gate.ChangeConfirm:
		return c.Settle != nil && c.Expect == gate.StatePendingEffect && c.Lookup == nil
	case gate.ChangeAcked:
		return c.Expect == gate.StateAckPending
	}
	return false
}

// rowOnly says whether c writes the operation's row (and its log) and no
// side row: no claim or intervention (which replace the fence and may
// record a delivery's fence, a reset or an intervention), no attempt begun
// or looked up, no further delivery's answer or attempt's end, no lost
// lease, no dead letter, no handoff. Those go in the row statement.
func rowOnly(c *gate.Change) bool {
	if c.Claim != nil || c.Intervene != nil || c.Start != nil || c.Lookup != nil || c.DeadLetter != nil ||
		c.Kind == gate.ChangeHandoff {
		return false
	}
	if st := c.Settle; st != nil {
		return st.Lease.LostAt == nil && (st.Answer == nil || st.Answer.N <= 1) && (st.Finish == nil || st.Finish.N <= 1)
	}
	return true
}

func (a *changeArgs) add(k int, c *gate.Change) {
	at := micro(orNow(c.At))
	a.i = append(a.i, k)
	a.id = append(a.id, c.OperationID)
	a.expect = append(a.expect, string(c.Expect))
	a.fence = append(a.fence, c.Fence)
	a.takes = append(a.takes, c.Claim != nil || c.Intervene != nil)
	a.at = append(a.at, a.times.at(at))
	var final *string
	if n := len(c.Steps); n > 0 {
		s := string(c.Steps[n-1].To)
		final = &s
	}
	a.final = append(a.final, final)
	a.steps = append(a.steps, len(c.Steps))
	a.logs = append(a.logs, !common(c))
	for s, st := range c.Steps {
		a.stepI = append(a.stepI, k)
		a.stepK = append(a.stepK, s+1)
		a.stepFrom = append(a.stepFrom, string(st.From))
		a.stepTo = append(a.stepTo, string(st.To))
		a.stepReason = append(a.stepReason, st.Reason)
	}
	a.reason = append(a.reason, textOrNull(c.Reason, c.Kind != gate.ChangeAcked))

	var (
		owner                     *string
		claims, settles, reset    bool
		deadline, lost            *time.Time
		extensions                int
		deliveryN, answerN        int
		messageID                 string
		answerDecision, answerWhy string
	)
	switch {
	case c.Claim != nil:
		owner, claims, reset = &c.Claim.Owner, true, c.Claim.Reset
		deadline = a.times.at(c.Claim.LeaseDeadline)
		if d := c.Claim.Delivery; d != nil {
			deliveryN, messageID = d.N, d.MessageID
		}
	case c.Intervene != nil:
		owner = &c.Intervene.Owner
	case c.Settle != nil:
		settles = true
		deadline, extensions, lost = a.times.at(c.Settle.Lease.Deadline), c.Settle.Lease.Extensions, a.times.ptr(c.Settle.Lease.LostAt)
		if ans := c.Settle.Answer; ans != nil && ans.N > 0 {
			answerN, answerDecision, answerWhy = ans.N, string(ans.Decision), ans.Reason
		}
	}
	a.owner = append(a.owner, owner)
	a.claims = append(a.claims, claims)
	a.settles = append(a.settles, settles)
	a.reset = append(a.reset, reset)
	a.leaseDeadline = append(a.leaseDeadline, deadline)
	a.leaseExtensions = append(a.leaseExtensions, extensions)
	a.leaseLostAt = append(a.leaseLostAt, lost)
	a.deliveryN = append(a.deliveryN, deliveryN)
	a.messageID = append(a.messageID, messageID)
	a.answerN = append(a.answerN, answerN)
	a.answerDecision = append(a.answerDecision, answerDecision)
	a.answerReason = append(a.answerReason, answerWhy)

	var fin gate.Attempt
	var finishedAt *time.Time
	if c.Settle != nil && c.Settle.Finish != nil {
		fin = *c.Settle.Finish
		done := at
		if fin.FinishedAt != nil {
			done = *fin.FinishedAt
		}
		finishedAt = a.times.at(done)
	}
	a.finishN = append(a.finishN, fin.N)
	a.finishedAt = append(a.finishedAt, finishedAt)
	a.finishOutcome = append(a.finishOutcome, string(fin.Outcome))
	a.finishStatus = append(a.finishStatus, fin.StatusCode)
	a.finishResultID = append(a.finishResultID, fin.ResultID)
	a.finishReason = append(a.finishReason, fin.Reason)

	var startN int
	var startedAt *time.Time
	contract := ""
	if s := c.Start; s != nil {
		startN, contract = s.N, s.ContractVersion
		t := s.StartedAt
		if t.IsZero() {
			t = at
		}
		startedAt = a.times.at(t)
	}
	var look gate.Attempt
	var lookStarted, lookFinished *time.Time
	if l := c.Lookup; l != nil {
		look = *l
		lookStarted, lookFinished = a.times.at(l.StartedAt), a.times.ptr(l.FinishedAt)
		if contract == "" {
			contract = l.ContractVersion
		}
	}
	a.startN = append(a.startN, startN)
	a.startedAt = append(a.startedAt, startedAt)
	a.contract = append(a.contract, contract)
	a.lookupN = append(a.lookupN, look.N)
	a.lookupStartedAt = append(a.lookupStartedAt, lookStarted)
	a.lookupFinishedAt = append(a.lookupFinishedAt, lookFinished)
	a.lookupOutcome = append(a.lookupOutcome, string(look.Outcome))
	a.lookupStatus = append(a.lookupStatus, look.StatusCode)
	a.lookupResultID = append(a.lookupResultID, look.ResultID)
	a.lookupReason = append(a.lookupReason, look.Reason)

	// Evidence is recorded by the change whose path enters effect_confirmed.
	evidence := slices.ContainsFunc(c.Steps, func(s gate.Step) bool { return s.To == gate.StateEffectConfirmed })
	a.evidence = append(a.evidence, evidence)
	a.resultID = append(a.resultID, textOrNull(c.ResultID, evidence))
	a.lane = append(a.lane, textOrNull(c.Lane, c.Kind == gate.ChangeIndeterminate))
	a.acked = append(a.acked, c.Kind == gate.ChangeAcked)
	a.handedOff = append(a.handedOff, c.Kind == gate.ChangeHandoff)

	var grant, checks int
	var schedule bool
	var next *time.Time
	var iv *gate.Intervention
	if v := c.Intervene; v != nil {
		grant, schedule, next, checks, iv = v.Grant, true, a.times.ptr(v.NextCheckAt), v.Checks, v.Intervention
	}
	a.grant = append(a.grant, grant)
	a.schedule = append(a.schedule, schedule)
	a.nextCheckAt = append(a.nextCheckAt, next)
	a.checks = append(a.checks, checks)
	var dead *string
	if c.DeadLetter != nil {
		dead = &c.DeadLetter.Reason
	}
	a.deadReason = append(a.deadReason, dead)
	if iv != nil {
		a.intervention = append(a.intervention, textOrNull(string(iv.Kind), true))
		a.actor = append(a.actor, &iv.Actor)
		a.interventionReason = append(a.interventionReason, &iv.Reason)
		a.interventionResultID = append(a.interventionResultID, &iv.ResultID)
	} else {
		a.intervention = append(a.intervention, nil)
		a.actor = append(a.actor, nil)
		a.interventionReason = append(a.interventionReason, nil)
		a.interventionResultID = append(a.interventionResultID, nil)
	}
}

func (a *changeArgs) named() pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{
		"i": a.i, "id": a.of(a.id), "expect": a.of(a.expect), "fence": a.fence, "takes": a.takes, "at": a.at,
		"final": a.ofNull(a.final), "steps": a.steps, "logs": a.logs, "reason": a.ofNull(a.reason), "owner": a.ofNull(a.owner),
		"claims": a.claims, "settles": a.settles, "lease_deadline": a.leaseDeadline,
		"lease_extensions": a.leaseExtensions, "lease_lost_at": a.leaseLostAt, "delivery_n": a.deliveryN,
		"message_id": a.of(a.messageID), "answer_n": a.answerN, "answer_decision": a.of(a.answerDecision),
		"answer_reason": a.of(a.answerReason), "finish_n": a.finishN, "finished_at": a.finishedAt,
		"finish_outcome": a.of(a.finishOutcome), "finish_status": a.finishStatus, "finish_result_id": a.of(a.finishResultID),
		"finish_reason": a.of(a.finishReason), "start_n": a.startN, "started_at": a.startedAt, "contract": a.of(a.contract),
		"lookup_n": a.lookupN, "lookup_started_at": a.lookupStartedAt, "lookup_finished_at": a.lookupFinishedAt,
		"lookup_outcome": a.of(a.lookupOutcome), "lookup_status": a.lookupStatus, "lookup_result_id": a.of(a.lookupResultID),
		"lookup_reason": a.of(a.lookupReason), "evidence": a.evidence, "result_id": a.ofNull(a.resultID), "lane": a.ofNull(a.lane),
		"acked": a.acked, "handed_off": a.handedOff, "grant": a.grant, "schedule": a.schedule,
		"next_check_at": a.nextCheckAt, "checks": a.checks, "dead_reason": a.ofNull(a.deadReason),
		"intervention": a.ofNull(a.intervention), "actor": a.ofNull(a.actor), "intervention_reason": a.ofNull(a.interventionReason),
		"intervention_result_id": a.ofNull(a.interventionResultID), "reset": a.reset,
		"step_i": a.stepI, "step_k": a.stepK, "step_from": a.of(a.stepFrom), "step_to": a.of(a.stepTo),
		"step_reason": a.of(a.stepReason),
	}
}

// rowNamed is a's arrays that the row statement reads.
func (a *changeArgs) rowNamed() pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{
		"i": a.i, "id": a.of(a.id), "expect": a.of(a.expect), "fence": a.fence, "at": a.at, "final": a.ofNull(a.final),
		"steps": a.steps, "logs": a.logs, "reason": a.ofNull(a.reason), "settles": a.settles,
		"lease_deadline": a.leaseDeadline, "lease_extensions": a.leaseExtensions, "answer_n": a.answerN,
		"answer_decision": a.of(a.answerDecision), "answer_reason": a.of(a.answerReason), "finish_n": a.finishN,
		"finished_at": a.finishedAt, "finish_outcome": a.of(a.finishOutcome), "finish_status": a.finishStatus,
		"finish_result_id": a.of(a.finishResultID), "finish_reason": a.of(a.finishReason), "evidence": a.evidence,
		"result_id": a.ofNull(a.resultID), "lane": a.ofNull(a.lane), "acked": a.acked,
		"step_i": a.stepI, "step_k": a.stepK, "step_from": a.of(a.stepFrom), "step_to": a.of(a.stepTo),
		"step_reason": a.of(a.stepReason),
	}
}

// answerArgs are the answer statement's arrays, one element per delivery.
type answerArgs struct {
	id, decision, reason, anomaly []string
	n                             []int
	resetFence                    []int64
	at                            []time.Time
}

func (a *answerArgs) add(id string, ans *gate.Answer) {
	a.id = append(a.id, id)
	a.n = append(a.n, ans.N)
	a.decision = append(a.decision, string(ans.Decision))
	a.reason = append(a.reason, ans.Reason)
	a.anomaly = append(a.anomaly, ans.Anomaly)
	a.resetFence = append(a.resetFence, ans.ResetFence)
	a.at = append(a.at, micro(time.Now()))
}

func (a *answerArgs) named() pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{"id": a.id, "n": a.n, "decision": a.decision, "reason": a.reason,
		"anomaly": a.anomaly, "reset_fence": a.resetFence, "at": a.at}
}

// texts is how a statement's text columns go to pgx: as textArray and
// nullTextArray where the server describes each statement's parameters
// (pgx's statement-caching and describe modes, the default), else as the
// plain slices, whose Postgres type pgx knows from their Go type (the exec
// and simple-protocol modes used behind a pooler).
type texts struct{ described bool }

func (t texts) of(v []string) any {
	if t.described {
		return textArray(v)
	}
	return v
}

func (t texts) ofNull(v []*string) any {
	if t.described {
		return nullTextArray(v)
	}
	return v
}

// textArray is a text[] argument that pgx encodes without an allocation per
// element. Given a []string, pgx hands each element to the text encoder as
// an interface value, and a string put in an interface is copied to the
// heap: with fifty-odd text columns a batch, that was the largest source of
// allocations left in the gateway. Index hands out a pointer into the slice
// instead, which an interface holds as it is, and the text encoder reads it
// through TextValue.
type textArray []string

func (a textArray) Dimensions() []pgtype.ArrayDimension { return flatDimensions(len(a), a == nil) }

func (a textArray) Index(i int) any { return (*textElem)(&a[i]) }

func (a textArray) IndexType() any { return new(textElem) }

// nullTextArray is textArray for a column of nullable text: a nil element
// is a NULL.
type nullTextArray []*string

func (a nullTextArray) Dimensions() []pgtype.ArrayDimension { return flatDimensions(len(a), a == nil) }

func (a nullTextArray) Index(i int) any {
	if a[i] == nil {
		return nil
	}
	return (*textElem)(a[i])
}

func (a nullTextArray) IndexType() any { return new(textElem) }

type textElem string

// flatDimensions are a one-dimensional array's of n elements, as
// pgtype.FlatArray gives them: none for a nil slice, which is NULL.
func flatDimensions(n int, null bool) []pgtype.ArrayDimension {
	if null {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

func (t *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*t), Valid: true}, nil
}
