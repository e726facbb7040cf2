package main

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ackgate/ackgate/downstream"
)

// maxBody bounds what one effect request may carry.
const maxBody = 1 << 20

// maxDelay caps ?delay= so a typo cannot park a handler for hours.
const maxDelay = time.Minute

// effect is one applied effect. The body itself is not kept, only its digest:
// that is all it takes to tell a repeat from a reused key.
type effect struct {
	ID         string    `json:"id"`
	Key        string    `json:"key"`
	BodySHA256 string    `json:"body_sha256"`
	Operation  string    `json:"operation,omitempty"`
	Fence      string    `json:"fence,omitempty"`
	AppliedAt  time.Time `json:"applied_at"`
	Repeats    int       `json:"repeats"`
}

type counts struct {
	Effects   int `json:"effects"`
	Repeats   int `json:"repeats"`
	Conflicts int `json:"conflicts"`
	Failed    int `json:"injected_failures"`
	Dropped   int `json:"dropped_answers"`
}

type store struct {
	mu      sync.Mutex
	effects map[string]*effect
	counts  counts
}

func newStore() *store { return &store{effects: map[string]*effect{}} }

type applyResult int

const (
	applied applyResult = iota
	repeated
	conflict
)

// apply performs the pretend effect at most once per key. The check and the
// insert happen under one lock, so concurrent requests with one key apply once.
func (s *store) apply(key, sum, operation, fence string) (effect, applyResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.effects[key]; ok {
		if e.BodySHA256 != sum {
			s.counts.Conflicts++
			return effect{}, conflict
		}
		e.Repeats++
		s.counts.Repeats++
		return *e, repeated
	}
	e := &effect{
		ID:         "fx_" + strings.ToLower(crand.Text()),
		Key:        key,
		BodySHA256: sum,
		Operation:  operation,
		Fence:      fence,
		AppliedAt:  time.Now().UTC(),
	}
	s.effects[key] = e
	s.counts.Effects++
	return *e, applied
}

func (s *store) get(key string) (effect, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.effects[key]
	if !ok {
		return effect{}, false
	}
	return *e, true
}

func (s *store) count(f func(*counts)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.counts)
}

func (s *store) snapshot() counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// faultSwitch holds the faults applied to every effect call: those of the
// flags at start, replaced at run time by PUT /faults and restored by
// DELETE /faults, so a walk-through can make the downstream fail and then
// "fix" it without a restart.
type faultSwitch struct {
	mu   sync.Mutex
	base faults
	cur  faults
}

func (s *faultSwitch) get() faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *faultSwitch) set(f faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = f
}

// faultsJSON is how GET and PUT /faults show the faults in force.
type faultsJSON struct {
	FailRate   float64 `json:"fail_rate"`
	FailStatus int     `json:"fail_status"`
	DropRate   float64 `json:"drop_rate"`
}

// newServer is the whole API surface.
func newServer(st *store, f faults, logger *slog.Logger) http.Handler {
	sw := &faultSwitch{base: f, cur: f}
	mux := http.NewServeMux()
	mux.Handle("POST /effects", handleApply(st, sw.get))
	mux.Handle("GET /faults", handleFaults(sw, nil))
	mux.Handle("PUT /faults", handleFaults(sw, parseFaults))
	mux.Handle("DELETE /faults", handleFaults(sw, func(*http.Request) (faults, error) { return sw.base, nil }))
	mux.Handle("GET /effects/{key}", handleGet(st))
	mux.Handle("GET /effects", handleCounts(st))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	return logRequests(logger, mux)
}

// handleFaults answers with the faults in force, after replacing them with
// what next makes of the request when next is set.
func handleFaults(sw *faultSwitch, next func(*http.Request) (faults, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if next != nil {
			f, err := next(r)
			if err != nil {
				writeError(w, r, http.StatusBadRequest, err.Error())
				return
			}
			sw.set(f)
		}
		f := sw.get()
		writeJSON(w, http.StatusOK, faultsJSON{FailRate: f.failRate, FailStatus: f.failStatus, DropRate: f.dropRate})
	})
}

// parseFaults reads PUT /faults's query: fail=STATUS (every effect call
// answered STATUS, nothing applied), drop=1 (every new effect applied and
// its answer lost), or the rates fail_rate (with fail_status, 503 unless
// given) and drop_rate. What the query does not name is off.
func parseFaults(r *http.Request) (faults, error) {
	q := r.URL.Query()
	f := faults{failStatus: http.StatusServiceUnavailable}
	var err error
	if v := q.Get("fail_status"); v != "" {
		if f.failStatus, err = parseStatus(v); err != nil {
			return faults{}, fmt.Errorf("fail_status: %w", err)
		}
	}
	if v := q.Get("fail_rate"); v != "" {
		if f.failRate, err = parseRate("fail_rate", v); err != nil {
			return faults{}, err
		}
	}
	if v := q.Get("drop_rate"); v != "" {
		if f.dropRate, err = parseRate("drop_rate", v); err != nil {
			return faults{}, err
		}
	}
	if v := q.Get("fail"); v != "" {
		if f.failStatus, err = parseStatus(v); err != nil {
			return faults{}, fmt.Errorf("fail: %w", err)
		}
		f.failRate = 1
	}
	if v := q.Get("drop"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return faults{}, fmt.Errorf("drop: %q is not a boolean", v)
		}
		if on {
			f.dropRate = 1
		}
	}
	return f, nil
}

func handleApply(st *store, current func() faults) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := current()
		key := r.Header.Get(downstream.HeaderIdempotencyKey)
		if key == "" {
			writeError(w, r, http.StatusBadRequest, "an Idempotency-Key header is required")
			return
		}
		note(r, "key", key)
		if status, ok := failure(r, f); ok {
			st.count(func(c *counts) { c.Failed++ })
			writeError(w, r, status, "injected failure, nothing applied")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			writeError(w, r, http.StatusRequestEntityTooLarge, "body over 1 MiB")
			return
		}
		sum := sha256.Sum256(body)
		e, res := st.apply(key, hex.EncodeToString(sum[:]),
			r.Header.Get(downstream.HeaderOperation), r.Header.Get(downstream.HeaderFence))
		switch res {
		case conflict:
			writeError(w, r, http.StatusConflict, "Idempotency-Key reused with a different body")
			return
		case repeated:
			note(r, "outcome", "repeat")
			w.Header().Set("Idempotent-Replayed", "true")
			writeEffect(w, http.StatusOK, e)
			return
		}
		note(r, "outcome", "applied")
		if drop(r, f) {
			st.count(func(c *counts) { c.Dropped++ })
			note(r, "outcome", "applied, answer dropped")
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		if d := delay(r); d > 0 {
			note(r, "delay", d.String())
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return // the caller gave up; the effect stays applied
			}
		}
		writeEffect(w, http.StatusCreated, e)
	})
}

func handleGet(st *store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		note(r, "key", key)
		if status, ok := failure(r, faults{}); ok {
			writeError(w, r, status, "injected failure")
			return
		}
		e, ok := st.get(key)
		if !ok {
			writeError(w, r, http.StatusNotFound, "no effect with that key")
			return
		}
		writeEffect(w, http.StatusOK, e)
	})
}

func handleCounts(st *store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, st.snapshot())
	})
}

// failure decides whether to inject a failure: ?fail=<status> always, or the
// configured rate.
func failure(r *http.Request, f faults) (int, bool) {
	if q := r.URL.Query().Get("fail"); q != "" {
		if n, err := parseStatus(q); err == nil {
			return n, true
		}
	}
	if f.failRate > 0 && rand.Float64() < f.failRate {
		return f.failStatus, true
	}
	return 0, false
}

func drop(r *http.Request, f faults) bool {
	if q := r.URL.Query().Get("drop"); q != "" {
		b, err := strconv.ParseBool(q)
		return err == nil && b
	}
	return f.dropRate > 0 && rand.Float64() < f.dropRate
}

func delay(r *http.Request) time.Duration {
	d, err := time.ParseDuration(r.URL.Query().Get("delay"))
	if err != nil || d <= 0 {
		return 0
	}
	return min(d, maxDelay)
}

func writeEffect(w http.ResponseWriter, status int, e effect) {
	w.Header().Set("X-Result-Id", e.ID)
	writeJSON(w, status, e)
}

func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	note(r, "outcome", msg)
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// logLine collects what a handler wants said about its request, so the
// middleware writes one line per request with all of it.
type logLine struct {
	mu    sync.Mutex
	attrs map[string]string
}

type logLineKey struct{}

func note(r *http.Request, k, v string) {
	if l, ok := r.Context().Value(logLineKey{}).(*logLine); ok {
		l.mu.Lock()
		l.attrs[k] = v
		l.mu.Unlock()
	}
}

func logRequests(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		line := &logLine{attrs: map[string]string{}}
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), logLineKey{}, line)))
		attrs := []any{"method", r.Method, "path", r.URL.Path, "status", rec.status, "dur", time.Since(start).Round(time.Microsecond).String()}
		line.mu.Lock()
		for _, k := range []string{"key", "outcome", "delay"} {
			if v, ok := line.attrs[k]; ok {
				attrs = append(attrs, k, v)
			}
		}
		line.mu.Unlock()
		logger.Info("request", attrs...)
	})
}

// statusRecorder remembers the status for the log line; 0 means no answer was
// written (a dropped connection). Unwrap keeps Hijack reachable through
// http.ResponseController.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
