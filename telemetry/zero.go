package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/recovery"
)

// A counter series that first appears at 1 hides its first increment from
// rate() and increase(): an alert on "any terminal failure in the last hour"
// would miss the first one after every restart. So every series an alert
// or a dashboard reads is put at 0 as soon as the gateway knows its routes.
// The label values below are the fixed sets the gateway itself uses; none
// comes from a request.
var (
	zeroDecisions = []gate.Decision{gate.Ack, gate.Nack, gate.Reject}
	// zeroStatuses are the statuses a known route's push endpoint answers
	// (handlers/status.go); 404 is only ever counted for route "unknown".
	zeroStatuses      = []int{204, 400, 401, 403, 413, 503}
	zeroMalformed     = []string{"envelope", "identity", "publish_time"}
	zeroAuthPlaces    = []string{"api", "metrics", "console"}
	zeroAuthWhys      = []string{"missing", "not_bearer", "wrong_token"}
	zeroRelayOutcomes = []string{recovery.RelayAcked, recovery.RelayDeadLettered, recovery.RelayRetry, recovery.RelayParked, recovery.RelayError}
	zeroRelayStages   = []string{recovery.StageClaim, recovery.StageSweep, recovery.StageReschedule}
)

// Routes puts every per-route counter at 0 for each configured route:
// deliveries by decision, responses by status, malformed deliveries by
// kind, transitions along every edge of the lifecycle, contended
// reservations. Call it once at start, with the routes being served.
func (m *Metrics) Routes(routes []*gate.Route) {
	ctx := context.Background()
	for _, r := range routes {
		for _, d := range zeroDecisions {
			m.deliveries.Add(ctx, 0, m.with(labels{names: deliveredLabels, a: string(r.Broker), b: r.Name, c: string(d)}).add...)
		}
		for _, s := range zeroStatuses {
			m.responses.Add(ctx, 0, m.with(labels{names: responseLabels, a: string(r.Broker), b: r.Name, status: s}).add...)
		}
		for _, k := range zeroMalformed {
			m.malformed.Add(ctx, 0, m.with(labels{names: malformedLabels, a: string(r.Broker), b: r.Name, c: k}).add...)
		}
		edges := append([]gate.Transition{{To: gate.StateReceived}, {To: gate.StateConflicting}}, gate.Transitions()...)
		for _, e := range edges {
			from := string(e.From)
			if from == "" {
				from = "new"
			}
			m.transitions.Add(ctx, 0, m.with(labels{names: transitionLabels, a: r.Name, b: from, c: string(e.To)}).add...)
		}
		m.contended.Add(ctx, 0, m.with(labels{names: contendedLabels, a: r.Name}).add...)
	}
}

// zeroAdminAuth puts the admin listener's refusal counter at 0 for every
// endpoint and reason; it needs no routes, so NewMetrics calls it.
func (m *Metrics) zeroAdminAuth() {
	for _, e := range zeroAuthPlaces {
		for _, r := range zeroAuthWhys {
			m.adminAuth.Add(context.Background(), 0, metric.WithAttributes(attribute.String("endpoint", e), attribute.String("reason", r)))
		}
	}
}

// Routes puts the relay's counters at 0: passes for every handoff route
// and outcome, failures for every stage.
func (r *RelayMetrics) Routes(routes []*gate.Route) {
	ctx := context.Background()
	for _, rt := range routes {
		if rt.Shape != gate.ShapeHandoff {
			continue
		}
		for _, o := range zeroRelayOutcomes {
			r.passes.Add(ctx, 0, metric.WithAttributes(attribute.String("route", rt.Name), attribute.String("outcome", o)))
		}
	}
	for _, s := range zeroRelayStages {
		r.failures.Add(ctx, 0, metric.WithAttributes(attribute.String("stage", s)))
	}
}
