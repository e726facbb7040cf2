package telemetry

import (
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// The SDK's default histogram boundaries (0, 5, 10, 25, ... 10000) are made
// for milliseconds; on a histogram in seconds every observation would land
// in the first bucket or two and a quantile would say nothing. Each duration
// histogram therefore gets boundaries in seconds, spread over the range its
// observations actually take.
var (
	// gateBuckets: the gate's own work per delivery (ledger round trips,
	// a Redis script, decisions), normally a few milliseconds; the top end
	// shows a ledger or Redis that stalls.
	gateBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	// callBuckets: one HTTP call to a downstream or its lookup, from a
	// local service's milliseconds up to the longest effect timeout worth
	// configuring; the alert on slow downstreams reads its p99 from here.
	callBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60}
	// relayBuckets: a relay pass is a call plus recording its evidence,
	// and a handoff route's effect timeout may be minutes.
	relayBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// histogramBuckets maps every duration histogram the gateway registers to
// its boundaries. TestEveryHistogramHasSecondBuckets fails when a histogram
// is added without an entry here.
var histogramBuckets = map[string][]float64{
	"ackgate.gate.duration":       gateBuckets,
	"ackgate.downstream.duration": callBuckets,
	"ackgate.reconcile.duration":  callBuckets,
	"ackgate.relay.duration":      relayBuckets,
}

// durationViews are the views that give each histogram its boundaries.
func durationViews() []sdkmetric.View {
	views := make([]sdkmetric.View, 0, len(histogramBuckets))
	for name, b := range histogramBuckets {
		views = append(views, sdkmetric.NewView(
			sdkmetric.Instrument{Name: name, Kind: sdkmetric.InstrumentKindHistogram},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: b}},
		))
	}
	return views
}
