package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// every runs tick at once and then every period until ctx ends. A tick's
// error, or its panic, is logged and the loop goes on: the next tick is the
// retry.
func every(ctx context.Context, period time.Duration, log *slog.Logger, name string, tick func(context.Context) error) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if err := safely(ctx, tick); err != nil && ctx.Err() == nil {
			log.Warn(name+" failed; trying again on the next tick", "err", err, "period", period.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func safely(ctx context.Context, tick func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return tick(ctx)
}
