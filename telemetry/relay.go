package telemetry

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ackgate/ackgate/gate"
)

// RelayMetrics counts the handoff relay's passes by outcome and the
// failures of its own bookkeeping (recovery.RelayRecorder).
type RelayMetrics struct {
	passes   metric.Int64Counter
	duration metric.Float64Histogram
	failures metric.Int64Counter
	limit    metric.Int64Gauge
	// limitSets are the route attribute sets of the limit gauge, one per
	// route, built once: the relay reads its limits every round.
	limitSets sync.Map // route -> metric.MeasurementOption
}

// NewRelayMetrics creates the relay's instruments on m's meter.
func (m *Metrics) NewRelayMetrics() (*RelayMetrics, error) {
	r := &RelayMetrics{}
	var err error
	if r.passes, err = m.meter.Int64Counter("ackgate.relay.passes",
		metric.WithDescription("Outbox entries the relay took up, by route and outcome: acked (effect evidenced), dead_lettered (attempts ran out), retry (still open, due again after a backoff), parked (outcome unknown, in the indeterminate lane), error (Redis, Postgres or the gate failed).")); err != nil {
		return nil, fmt.Errorf("telemetry: relay instruments: %w", err)
	}
	if r.duration, err = m.meter.Float64Histogram("ackgate.relay.duration", metric.WithUnit("s"),
		metric.WithDescription("Time one relay pass took, downstream call included, by route and outcome.")); err != nil {
		return nil, fmt.Errorf("telemetry: relay instruments: %w", err)
	}
	if r.failures, err = m.meter.Int64Counter("ackgate.relay.failures",
		metric.WithDescription("Failures of the relay's own work with the ledger, by stage: claim, sweep, reschedule.")); err != nil {
		return nil, fmt.Errorf("telemetry: relay instruments: %w", err)
	}
	if r.limit, err = m.meter.Int64Gauge("ackgate.relay.concurrency",
		metric.WithDescription("Outbox entries of a handoff route this replica relays at once at most, as its adaptive limit stands: it grows while the downstream keeps its latency and halves when it answers 429 or 503 or times out.")); err != nil {
		return nil, fmt.Errorf("telemetry: relay instruments: %w", err)
	}
	return r, nil
}

// RelayLimit implements recovery.RelayRecorder.
func (r *RelayMetrics) RelayLimit(ctx context.Context, route string, limit int) {
	opt, ok := r.limitSets.Load(route)
	if !ok {
		opt, _ = r.limitSets.LoadOrStore(route, metric.WithAttributeSet(attribute.NewSet(attribute.String("route", route))))
	}
	r.limit.Record(ctx, int64(limit), opt.(metric.RecordOption))
}

// Relayed implements recovery.RelayRecorder.
func (r *RelayMetrics) Relayed(ctx context.Context, route, outcome string, took time.Duration) {
	attrs := metric.WithAttributes(attribute.String("route", route), attribute.String("outcome", outcome))
	r.passes.Add(ctx, 1, attrs)
	r.duration.Record(ctx, took.Seconds(), attrs)
}

// RelayFailed implements recovery.RelayRecorder.
func (r *RelayMetrics) RelayFailed(ctx context.Context, stage string) {
	r.failures.Add(ctx, 1, metric.WithAttributes(attribute.String("stage", stage)))
}

// OutboxDepth is one route's undelivered outbox entries as a background
// count saw them (recovery.OutboxStat).
type OutboxDepth struct {
	Route     string
	Depth     int64
	Oldest    time.Time
	OldestDue time.Time
}

// ObserveOutbox registers the outbox gauges of the handoff routes, read
// from snapshot at collection time: undelivered entries per route, the age
// of the oldest, the relay's lag (how long the oldest entry it may take has
// been due), and the snapshot's own age. A scrape never queries the
// ledger. Every replica counts the same outbox, so alert on max, not sum.
func (m *Metrics) ObserveOutbox(routes []*gate.Route, snapshot func() (time.Time, []OutboxDepth)) error {
	var handoff []string
	for _, r := range routes {
		if r.Shape == gate.ShapeHandoff {
			handoff = append(handoff, r.Name)
		}
	}
	if len(handoff) == 0 {
		return nil
	}
	depth, err := m.meter.Int64ObservableGauge("ackgate.outbox.entries",
		metric.WithDescription("Outbox entries of a handoff route whose effect is not yet evidenced (including those of terminal or parked operations, kept for a replay), as of the latest background count."))
	if err != nil {
		return fmt.Errorf("telemetry: outbox gauge: %w", err)
	}
	oldest, err := m.meter.Float64ObservableGauge("ackgate.outbox.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest undelivered outbox entry per handoff route; 0 when there is none."))
	if err != nil {
		return fmt.Errorf("telemetry: outbox gauge: %w", err)
	}
	lag, err := m.meter.Float64ObservableGauge("ackgate.outbox.lag", metric.WithUnit("s"),
		metric.WithDescription("How far the relay is behind per handoff route, as of the latest background count: how long the oldest outbox entry it may take (its operation open, its time come) had been due; 0 when none was due. A lag that keeps growing means the outbox fills faster than the relay drains it."))
	if err != nil {
		return fmt.Errorf("telemetry: outbox gauge: %w", err)
	}
	age, err := m.meter.Float64ObservableGauge("ackgate.outbox.snapshot_age", metric.WithUnit("s"),
		metric.WithDescription("How old the outbox gauges' numbers are: time since the background count they come from."))
	if err != nil {
		return fmt.Errorf("telemetry: outbox gauge: %w", err)
	}
	_, err = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		at, stats := snapshot()
		if at.IsZero() {
			return nil
		}
		now := time.Now()
		o.ObserveFloat64(age, now.Sub(at).Seconds())
		seen := make(map[string]OutboxDepth, len(stats))
		for _, s := range stats {
			seen[s.Route] = s
		}
		for _, name := range handoff {
			s := seen[name]
			attrs := metric.WithAttributes(attribute.String("route", name))
			o.ObserveInt64(depth, s.Depth, attrs)
			var a float64
			if s.Depth > 0 && !s.Oldest.IsZero() {
				a = max(0, now.Sub(s.Oldest).Seconds())
			}
			o.ObserveFloat64(oldest, a, attrs)
			// As of the count, not the scrape: the entry may have been
			// relayed since, and a lag must not grow while nothing is
			// counted.
			var behind float64
			if s.Depth > 0 && !s.OldestDue.IsZero() {
				behind = max(0, at.Sub(s.OldestDue).Seconds())
			}
			o.ObserveFloat64(lag, behind, attrs)
		}
		return nil
	}, depth, oldest, lag, age)
	if err != nil {
		return fmt.Errorf("telemetry: outbox gauge: %w", err)
	}
	return nil
}
