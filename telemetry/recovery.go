package telemetry

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// RecoveryMetrics counts the background work of package recovery: the
// reconciler's operations by outcome, and the purge's progress.
type RecoveryMetrics struct {
	reconciled   metric.Int64Counter
	reconcileDur metric.Float64Histogram
	purged       metric.Int64Counter
	poison       metric.Int64Counter

	mu       sync.Mutex
	finished time.Time
	kept     map[string]int64
}

// NewRecoveryMetrics creates the instruments on m's meter. routes are the
// configured route names, reported 0 in the kept-open gauge when nothing
// is kept.
func (m *Metrics) NewRecoveryMetrics(routes []string) (*RecoveryMetrics, error) {
	r := &RecoveryMetrics{kept: map[string]int64{}}
	for _, n := range routes {
		r.kept[n] = 0
	}
	var err error
	mk := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	mk(func() (e error) {
		r.reconciled, e = m.meter.Int64Counter("ackgate.reconcile.operations",
			metric.WithDescription("Indeterminate operations the reconciler took up, by route and outcome: found (confirmed), absent (one attempt granted), unavailable (checked again later), held (a delivery or operator held the lease), refused (changed meanwhile), error."))
		return
	})
	mk(func() (e error) {
		r.reconcileDur, e = m.meter.Float64Histogram("ackgate.reconcile.duration", metric.WithUnit("s"),
			metric.WithDescription("Time the reconciler spent on one operation, lookup included, by route and outcome."))
		return
	})
	mk(func() (e error) {
		r.purged, e = m.meter.Int64Counter("ackgate.purge.operations",
			metric.WithDescription("Operations removed with their evidence after their retention ran out, by route."))
		return
	})
	mk(func() (e error) {
		r.poison, e = m.meter.Int64Counter("ackgate.purge.poison",
			metric.WithDescription("Poison records removed after their route's retention."))
		return
	})
	mk(func() error {
		last, e := m.meter.Float64ObservableGauge("ackgate.purge.last_finished", metric.WithUnit("s"),
			metric.WithDescription("Unix time at which this replica's purge last ran to the end; absent before its first run."))
		if e != nil {
			return e
		}
		kept, e := m.meter.Int64ObservableGauge("ackgate.purge.kept_open",
			metric.WithDescription("Operations past their retention that the purge keeps because they are not settled (open, indeterminate, or confirmed without a recorded ack), per route, as of the last run."))
		if e != nil {
			return e
		}
		_, e = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.finished.IsZero() {
				return nil
			}
			o.ObserveFloat64(last, float64(r.finished.UnixNano())/1e9)
			for route, n := range r.kept {
				o.ObserveInt64(kept, n, metric.WithAttributes(attribute.String("route", route)))
			}
			return nil
		}, last, kept)
		return e
	})
	if err != nil {
		return nil, fmt.Errorf("telemetry: recovery instruments: %w", err)
	}
	return r, nil
}

// Reconciled implements recovery.LookupRecorder.
func (r *RecoveryMetrics) Reconciled(ctx context.Context, route, outcome string, took time.Duration) {
	attrs := metric.WithAttributes(attribute.String("route", route), attribute.String("outcome", outcome))
	r.reconciled.Add(ctx, 1, attrs)
	r.reconcileDur.Record(ctx, took.Seconds(), attrs)
}

// PurgedOperations implements recovery.PurgeRecorder.
func (r *RecoveryMetrics) PurgedOperations(ctx context.Context, route string, n int64) {
	r.purged.Add(ctx, n, metric.WithAttributes(attribute.String("route", route)))
}

// PurgedPoison implements recovery.PurgeRecorder.
func (r *RecoveryMetrics) PurgedPoison(ctx context.Context, n int64) { r.poison.Add(ctx, n) }

// PurgeFinished implements recovery.PurgeRecorder. Routes kept before and
// not now report 0.
func (r *RecoveryMetrics) PurgeFinished(_ context.Context, at time.Time, keptOpen map[string]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished = at
	for route := range r.kept {
		r.kept[route] = 0
	}
	maps.Copy(r.kept, keptOpen)
}
