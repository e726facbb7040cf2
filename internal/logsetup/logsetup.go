// Package logsetup gives a process one structured log stream: a slog
// handler in the format one setting chooses (JSON or text), and the
// libraries that would otherwise print lines of their own (the standard
// log package, the OpenTelemetry SDK's error handler and logger,
// go-redis's logger) routed into it, rate-limited, so that a log shipper
// reading the process's output never meets a line it cannot parse.
package logsetup

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"golang.org/x/time/rate"
)

// Formats are the values of the format setting.
const (
	FormatJSON = "json"
	FormatText = "text"
)

// New returns a logger writing to w in format ("json", the default when
// empty, or "text") at level.
func New(w io.Writer, format string, level slog.Leveler) (*slog.Logger, error) {
	h, err := NewHandler(w, format, level)
	if err != nil {
		return nil, err
	}
	return slog.New(h), nil
}

// NewHandler is New's handler, for a caller that wraps it.
func NewHandler(w io.Writer, format string, level slog.Leveler) (slog.Handler, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(format) {
	case FormatJSON, "":
		return slog.NewJSONHandler(w, opts), nil
	case FormatText:
		return slog.NewTextHandler(w, opts), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// Library lines are limited per source: a burst of libraryBurst, then one
// every libraryEvery. A library that fails in a loop (an exporter whose
// collector is down, a pool that cannot dial) says so without drowning the
// gateway's own lines; each line after a gap says how many it left out.
const (
	libraryBurst = 5
	libraryEvery = 10 * time.Second
	// maxLibraryText bounds a library's message: its text is not ours to
	// bound, and an error can quote a whole response.
	maxLibraryText = 1024
)

// Adopt makes l the process's default logger and routes the libraries'
// output into it: the standard log package, the OpenTelemetry SDK's error
// handler (span and metric export failures) and its internal logger, and
// go-redis's logger. Each source is rate-limited on its own and marked with
// a "source" attribute. Call it once, at start.
func Adopt(l *slog.Logger) {
	slog.SetDefault(l)
	// After SetDefault, the log package writes into l at Info; this puts
	// its lines through a limiter of their own instead.
	std := newLimited(l, "log")
	otelErrs := newLimited(l, "opentelemetry")
	rds := newLimited(l, "redis")
	log.SetFlags(0)
	log.SetPrefix("")
	log.SetOutput(writerFunc(func(p []byte) (int, error) {
		std.log(context.Background(), slog.LevelWarn, strings.TrimRight(string(p), "\n"))
		return len(p), nil
	}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		otelErrs.log(context.Background(), slog.LevelError, err.Error())
	}))
	// The SDK logs at logr verbosity 0 (errors), 1 (warnings), 4 (info)
	// and 8 (debug); as slog levels those are below Info, so only what it
	// reports as errors gets through at the default level.
	otel.SetLogger(logr.FromSlogHandler(otelErrs.handler()))
	redis.SetLogger(redisLogger{rds})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// limited is one library's way into the log: a token bucket, and the count
// of lines it turned away since the last one it let through.
type limited struct {
	l       *slog.Logger
	limiter *rate.Limiter
	mu      sync.Mutex
	dropped int
}

func newLimited(l *slog.Logger, source string) *limited {
	return &limited{l: l.With("source", source), limiter: rate.NewLimiter(rate.Every(libraryEvery), libraryBurst)}
}

// allow reports whether a line may be written now, and how many were left
// out before it.
func (x *limited) allow() (bool, int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.limiter.Allow() {
		x.dropped++
		return false, 0
	}
	n := x.dropped
	x.dropped = 0
	return true, n
}

func (x *limited) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if !x.l.Enabled(ctx, level) {
		return
	}
	ok, dropped := x.allow()
	if !ok {
		return
	}
	if dropped > 0 {
		attrs = append(attrs, slog.Int("suppressed_since_last_line", dropped))
	}
	x.l.LogAttrs(ctx, level, bound(msg), attrs...)
}

// handler is x as a slog.Handler, for the libraries that take one.
func (x *limited) handler() slog.Handler { return limitedHandler{x: x, h: x.l.Handler()} }

type limitedHandler struct {
	x *limited
	h slog.Handler
}

func (lh limitedHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return lh.h.Enabled(ctx, level)
}

func (lh limitedHandler) Handle(ctx context.Context, r slog.Record) error {
	ok, dropped := lh.x.allow()
	if !ok {
		return nil
	}
	r.Message = bound(r.Message)
	if dropped > 0 {
		r.AddAttrs(slog.Int("suppressed_since_last_line", dropped))
	}
	return lh.h.Handle(ctx, r)
}

func (lh limitedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return limitedHandler{x: lh.x, h: lh.h.WithAttrs(as)}
}

func (lh limitedHandler) WithGroup(name string) slog.Handler {
	return limitedHandler{x: lh.x, h: lh.h.WithGroup(name)}
}

// redisLogger is go-redis's Logging interface. go-redis logs what went
// wrong with a connection or the pool; nothing it says is routine.
type redisLogger struct{ x *limited }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.x.log(ctx, slog.LevelWarn, fmt.Sprintf(format, v...))
}

func bound(s string) string {
	s = strings.TrimSpace(s)
	if len(s) <= maxLibraryText {
		return s
	}
	return strings.ToValidUTF8(s[:maxLibraryText], "") + "…"
}
