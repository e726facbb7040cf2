package telemetry

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ackgate/ackgate/gate"
)

// Metrics holds the gateway's instruments. Route names label every series;
// they come from the routes file, never from a request, so their number is
// bounded (an unknown route is counted as "unknown").
type Metrics struct {
	deliveries  metric.Int64Counter
	responses   metric.Int64Counter
	malformed   metric.Int64Counter
	transitions metric.Int64Counter
	contended   metric.Int64Counter
	adminAuth   metric.Int64Counter
	downstream  metric.Float64Histogram
	gate        metric.Float64Histogram
	meter       metric.Meter
	// sets holds the measurement option of each label combination seen, so
	// that a delivery's half a dozen measurements reuse their attribute sets
	// instead of building and sorting each one anew. The labels are bounded
	// (above), and so is the cache: a map typed by combination, read under
	// a read lock.
	setsMu sync.RWMutex
	sets   map[labels]labelSet
}

// labelSet is one label combination's attribute set as the options of Add
// and Record, each in a slice of its own that every measurement passes on
// as it is: a lone option passed to the variadic Add or Record is a new
// slice, on the heap since the instrument is an interface, on every call.
// The SDK only reads the options.
type labelSet struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

// labels are one measurement's label values; names says which label each
// value is for, so that two instruments' combinations never collide.
type labels struct {
	names   *[3]string
	a, b, c string
	status  int // Response's third label, kept as a number until a miss
}

var (
	deliveredLabels  = &[3]string{"broker", "route", "decision"}
	malformedLabels  = &[3]string{"broker", "route", "kind"}
	transitionLabels = &[3]string{"route", "from", "to"}
	contendedLabels  = &[3]string{"route"}
	downstreamLabels = &[3]string{"route", "kind", "outcome"}
	responseLabels   = &[3]string{"broker", "route", "status"}
)

// with returns the label set of l, built once.
func (m *Metrics) with(l labels) labelSet {
	m.setsMu.RLock()
	o, ok := m.sets[l]
	m.setsMu.RUnlock()
	if ok {
		return o
	}
	return m.newSet(l)
}

// newSet builds and keeps the measurement option of l. It is apart from
// with so that with's frame, on every measurement's stack, is small: the
// set's construction took the frame to 664 bytes, and the post-response
// work's fresh goroutines grew their stacks inside it.
//
//go:noinline
func (m *Metrics) newSet(l labels) labelSet {
	values := [3]string{l.a, l.b, l.c}
	if l.names == responseLabels {
		values[2] = strconv.Itoa(l.status)
	}
	kvs := make([]attribute.KeyValue, 0, 3)
	for i, name := range l.names {
		if name != "" {
			kvs = append(kvs, attribute.String(name, values[i]))
		}
	}
	m.setsMu.Lock()
	defer m.setsMu.Unlock()
	if o, ok := m.sets[l]; ok {
		return o // another measurement built it meanwhile
	}
	if m.sets == nil {
		m.sets = make(map[labels]labelSet)
	}
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	set := labelSet{add: []metric.AddOption{o}, record: []metric.RecordOption{o}}
	m.sets[l] = set
	return set
}

var _ gate.Recorder = (*Metrics)(nil)

// NewMetrics creates the instruments on mp.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := &Metrics{meter: mp.Meter("github.com/ackgate/ackgate")}
	var err error
	mk := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	mk(func() (e error) {
		m.deliveries, e = m.meter.Int64Counter("ackgate.deliveries",
			metric.WithDescription("Deliveries the gate answered, by broker, route and decision (ack, nack, reject)."))
		return
	})
	mk(func() (e error) {
		m.responses, e = m.meter.Int64Counter("ackgate.responses",
			metric.WithDescription("HTTP statuses returned to brokers on the push endpoints."))
		return
	})
	mk(func() (e error) {
		m.malformed, e = m.meter.Int64Counter("ackgate.malformed",
			metric.WithDescription("Deliveries refused as malformed, by broker, route and kind: envelope (not the broker's format), identity (no usable identity), publish_time (published in the future beyond the clock skew)."))
		return
	})
	mk(func() (e error) {
		m.transitions, e = m.meter.Int64Counter("ackgate.transitions",
			metric.WithDescription("Committed state transitions of operations, by route, from and to state."))
		return
	})
	mk(func() (e error) {
		m.contended, e = m.meter.Int64Counter("ackgate.reservation.contended",
			metric.WithDescription("Deliveries turned away because another owner held the operation's lease."))
		return
	})
	mk(func() (e error) {
		m.adminAuth, e = m.meter.Int64Counter("ackgate.admin.auth_failures",
			metric.WithDescription("Admin listener requests refused for their credential, by endpoint (api, metrics, console) and reason (missing, not_bearer, wrong_token)."))
		return
	})
	mk(func() (e error) {
		m.downstream, e = m.meter.Float64Histogram("ackgate.downstream.duration", metric.WithUnit("s"),
			metric.WithDescription("Downstream effect calls and lookups, by route, kind and outcome."))
		return
	})
	mk(func() (e error) {
		m.gate, e = m.meter.Float64Histogram("ackgate.gate.duration", metric.WithUnit("s"),
			metric.WithDescription("Time the gate spent on a delivery, downstream calls excluded: ledger, Redis and decisions."))
		return
	})
	if err != nil {
		return nil, fmt.Errorf("telemetry: instruments: %w", err)
	}
	m.zeroAdminAuth()
	return m, nil
}

// Delivered implements gate.Recorder.
func (m *Metrics) Delivered(ctx context.Context, r *gate.Route, b gate.Broker, d gate.Decision, gateTime time.Duration) {
	set := m.with(labels{names: deliveredLabels, a: string(b), b: r.Name, c: string(d)})
	m.deliveries.Add(ctx, 1, set.add...)
	m.gate.Record(ctx, gateTime.Seconds(), set.record...)
}

// Malformed counts a delivery refused as malformed. kind comes from the
// handlers' small fixed set, never from the request.
func (m *Metrics) Malformed(ctx context.Context, b gate.Broker, route, kind string) {
	m.malformed.Add(ctx, 1, m.with(labels{names: malformedLabels, a: string(b), b: route, c: kind}).add...)
}

// Transitioned implements gate.Recorder.
func (m *Metrics) Transitioned(ctx context.Context, r *gate.Route, steps []gate.Step) {
	for _, s := range steps {
		from := string(s.From)
		if from == "" {
			from = "new"
		}
		m.transitions.Add(ctx, 1, m.with(labels{names: transitionLabels, a: r.Name, b: from, c: string(s.To)}).add...)
	}
}

// Contended implements gate.Recorder.
func (m *Metrics) Contended(ctx context.Context, r *gate.Route) {
	m.contended.Add(ctx, 1, m.with(labels{names: contendedLabels, a: r.Name}).add...)
}

// Downstream implements gate.Recorder.
func (m *Metrics) Downstream(ctx context.Context, r *gate.Route, k gate.AttemptKind, o gate.Outcome, took time.Duration) {
	m.downstream.Record(ctx, took.Seconds(), m.with(labels{names: downstreamLabels, a: r.Name, b: string(k), c: string(o)}).record...)
}

// Response counts a status returned on a push endpoint. route is "unknown"
// when the request named a route the gateway does not have.
func (m *Metrics) Response(ctx context.Context, b gate.Broker, route string, status int) {
	m.responses.Add(ctx, 1, m.with(labels{names: responseLabels, a: string(b), b: route, status: status}).add...)
}

// AdminAuthFailed counts an admin request refused for its credential.
// endpoint and reason come from small fixed sets, never from the request.
func (m *Metrics) AdminAuthFailed(ctx context.Context, endpoint, reason string) {
	m.adminAuth.Add(ctx, 1, metric.WithAttributes(attribute.String("endpoint", endpoint), attribute.String("reason", reason)))
}

// Lane is how many operations of a route wait in one lane state, and when
// the oldest of them was created.
type Lane struct {
	Route  string
	State  gate.State
	N      int64
	Oldest time.Time
}

// laneStates are the states the lane gauges report for every route, 0 when
// empty, so an alert can see a lane clear. aged are those whose oldest
// operation's age is reported too: the work that waits on someone.
var (
	laneStates = []gate.State{gate.StateReceived, gate.StateReserved, gate.StatePendingEffect,
		gate.StateEffectIndeterminate, gate.StateEffectConfirmed, gate.StateAckPending, gate.StateTerminalFailure}
	agedStates = []gate.State{gate.StatePendingEffect, gate.StateEffectIndeterminate}
)

// GroupCommit is what the ledger's group commit has sent since the
// process started (storage.Ledger.GroupCommitLoad).
type GroupCommit struct {
	Batches, Steps int
	Out            time.Duration
}

// ObserveGroupCommit registers the group commit's counters, read from
// load at collection time. The rate of ackgate.ledger.busy near 1 means
// the ledger's one flusher is out all the time: deliveries then wait on
// its round trips, whatever CPU is left, and more replicas (each with its
// own flusher) carry more.
func (m *Metrics) ObserveGroupCommit(load func() GroupCommit) error {
	batches, err := m.meter.Int64ObservableCounter("ackgate.ledger.batches",
		metric.WithDescription("Round trips group commit sent to the ledger, each one transaction."))
	if err != nil {
		return fmt.Errorf("telemetry: group commit counter: %w", err)
	}
	steps, err := m.meter.Int64ObservableCounter("ackgate.ledger.batch_steps",
		metric.WithDescription("Steps (claims, changes, ack marks, answers) those round trips carried; over ackgate.ledger.batches, the mean batch."))
	if err != nil {
		return fmt.Errorf("telemetry: group commit counter: %w", err)
	}
	busy, err := m.meter.Float64ObservableCounter("ackgate.ledger.busy", metric.WithUnit("s"),
		metric.WithDescription("Time group commit's round trips were out, summed over flushers; its rate is how busy the flushers are (1: one flusher, always out)."))
	if err != nil {
		return fmt.Errorf("telemetry: group commit counter: %w", err)
	}
	_, err = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		l := load()
		o.ObserveInt64(batches, int64(l.Batches))
		o.ObserveInt64(steps, int64(l.Steps))
		o.ObserveFloat64(busy, l.Out.Seconds())
		return nil
	}, batches, steps, busy)
	if err != nil {
		return fmt.Errorf("telemetry: group commit callback: %w", err)
	}
	return nil
}

// ObserveLanes registers the lane gauges, read from snapshot at collection
// time: operations per route and lane state, the age of the oldest
// indeterminate and pending operation, and the snapshot's own age.
// snapshot returns the latest background count (a zero time before the first);
// a scrape never queries the ledger. Every replica counts the same shared
// ledger, so alert on max, not sum.
func (m *Metrics) ObserveLanes(routes []*gate.Route, snapshot func() (time.Time, []Lane)) error {
	ops, err := m.meter.Int64ObservableGauge("ackgate.lane.operations",
		metric.WithDescription("Operations waiting in each lane state, per route, as of the latest background count (ackgate.lane.snapshot_age)."))
	if err != nil {
		return fmt.Errorf("telemetry: lane gauge: %w", err)
	}
	oldest, err := m.meter.Float64ObservableGauge("ackgate.lane.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest operation in the pending_effect and effect_indeterminate lanes, per route; 0 when the lane is empty."))
	if err != nil {
		return fmt.Errorf("telemetry: lane gauge: %w", err)
	}
	age, err := m.meter.Float64ObservableGauge("ackgate.lane.snapshot_age", metric.WithUnit("s"),
		metric.WithDescription("How old the lane gauges' numbers are: time since the background count they come from."))
	if err != nil {
		return fmt.Errorf("telemetry: lane gauge: %w", err)
	}
	_, err = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		at, lanes := snapshot()
		if at.IsZero() {
			return nil // not counted yet: no numbers rather than false zeros
		}
		now := time.Now()
		o.ObserveFloat64(age, now.Sub(at).Seconds())
		seen := make(map[[2]string]Lane, len(lanes))
		for _, l := range lanes {
			seen[[2]string{l.Route, string(l.State)}] = l
		}
		for _, r := range routes {
			for _, st := range laneStates {
				l := seen[[2]string{r.Name, string(st)}]
				attrs := metric.WithAttributes(attribute.String("route", r.Name), attribute.String("state", string(st)))
				o.ObserveInt64(ops, l.N, attrs)
				if slices.Contains(agedStates, st) {
					var a float64
					if l.N > 0 && !l.Oldest.IsZero() {
						a = max(0, now.Sub(l.Oldest).Seconds())
					}
					o.ObserveFloat64(oldest, a, attrs)
				}
			}
		}
		return nil
	}, ops, oldest, age)
	if err != nil {
		return fmt.Errorf("telemetry: lane gauge: %w", err)
	}
	return nil
}
