package recovery

import (
	"context"
	"sync"
	"time"
)

// pacer is a token bucket: it lets a route's lookups through at rate per
// second on average, with bursts of at most burst. It is a few lines
// rather than a module because the reconciler needs only Wait.
type pacer struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

func newPacer(rate float64, now time.Time) *pacer {
	burst := max(1, rate)
	return &pacer{rate: rate, burst: burst, tokens: burst, last: now}
}

// reserve takes one token at now and says how long its holder must wait
// before using it (zero when one was available).
func (p *pacer) reserve(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.After(p.last) {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
		p.last = now
	}
	p.tokens--
	if p.tokens >= 0 {
		return 0
	}
	return time.Duration(-p.tokens / p.rate * float64(time.Second))
}

// wait blocks until the caller may make one call, or ctx ends.
func (p *pacer) wait(ctx context.Context) error {
	d := p.reserve(time.Now())
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
