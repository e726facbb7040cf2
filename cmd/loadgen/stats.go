package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// latencies summarises a set of durations by nearest-rank percentiles, which
// are always one of the observed values: no interpolation to invent a
// latency nobody saw.
type latencies struct {
	sorted []time.Duration
}

func summarize(d []time.Duration) latencies {
	s := slices.Clone(d)
	slices.Sort(s)
	return latencies{sorted: s}
}

func (l latencies) count() int { return len(l.sorted) }

// percentile is the smallest observed value that at least p percent of the
// observations do not exceed (nearest rank: index ceil(p/100*n) - 1). It is 0
// when nothing was observed.
func (l latencies) percentile(p float64) time.Duration {
	n := len(l.sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	return l.sorted[min(max(rank, 1), n)-1]
}

func (l latencies) max() time.Duration {
	if len(l.sorted) == 0 {
		return 0
	}
	return l.sorted[len(l.sorted)-1]
}

// ms formats a duration in milliseconds with a precision that suits it.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case d == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// ratio is a/b, or NaN when b is zero, so a missing baseline prints as n/a
// instead of a division by zero passing for a result.
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func perMessage(total float64, messages int) float64 {
	if messages == 0 {
		return math.NaN()
	}
	return total / float64(messages)
}
