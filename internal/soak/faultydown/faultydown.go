// Package faultydown is a downstream effect service that misbehaves on
// purpose and keeps an honest record of what it did. A soak points the
// gateway's routes at it and later compares its record, the provider's own
// truth, with the gateway's ledger.
//
// It speaks the protocol the gateway's effect client speaks: POST with an
// Idempotency-Key header, a result id in X-Result-Id and in the JSON body, and
// for endpoints with a lookup, GET .../effects/{key} answering 200 with the
// result id or 404. Each endpoint either deduplicates by key (a provider with
// idempotency keys) or applies every call (a provider without).
//
// Faults are drawn at random per call: a 5xx before anything is applied (the
// documented "nothing happened"), a connection cut after the effect was
// applied, an answer held past the caller's deadline after the effect was
// applied, a lookup that is unavailable. A body whose JSON carries "poison"
// fails every time until it is cured (Cure): "terminal" with 422,
// "retryable" with 503.
//
// An effect is applied as soon as the request is read, before any fault that
// loses the answer. A provider that applies after its caller gave up is a
// different and harder downstream; see docs/reliability.md.
package faultydown

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Endpoint is one effect service, served under /{Name}/effects.
type Endpoint struct {
	Name string
	// Dedupe: a repeated key with the same body returns the first result
	// without applying again; with a different body it is refused (422).
	Dedupe bool
	// Lookup serves GET /{Name}/effects/{key}.
	Lookup bool
}

// Faults are per-call probabilities.
type Faults struct {
	// Status5xx answers 503 without applying.
	Status5xx float64
	// LoseResponse applies, then closes the connection without an answer.
	LoseResponse float64
	// Slow applies, then answers after SlowDelay (or when the caller leaves).
	Slow      float64
	SlowDelay time.Duration
	// LookupDown answers a lookup with 503.
	LookupDown float64
}

// Broken makes the service lie, for showing that a soak's checker notices.
type Broken string

const (
	// NotBroken is an honest service.
	NotBroken Broken = ""
	// DoubleApply applies every effect twice.
	DoubleApply Broken = "double-apply"
	// Lie answers success with a result id and applies nothing.
	Lie Broken = "lie"
)

// ParseBroken accepts the names above.
func ParseBroken(s string) (Broken, error) {
	switch b := Broken(s); b {
	case NotBroken, DoubleApply, Lie:
		return b, nil
	}
	return "", fmt.Errorf("faultydown: unknown breakage %q (want %q or %q)", s, DoubleApply, Lie)
}

// Application is one effect the service applied.
type Application struct {
	Key      string
	ResultID string
	// BodySHA256 is the hex digest of the request body: which intent it was.
	BodySHA256 string
	// TraceID is from the request's traceparent header, for diagnosis.
	TraceID string
	Fence   string
	At      time.Time
}

// Counts are what the service did, by kind.
type Counts struct {
	Calls          int
	Applied        int
	Replayed       int
	KeyReuse       int
	Injected5xx    int
	LostResponses  int
	SlowResponses  int
	PoisonRefusals int
	Lookups        int
	LookupsDown    int
}

// EndpointRecord is an endpoint's whole history.
type EndpointRecord struct {
	Endpoint Endpoint
	// Applications are every effect applied, in order.
	Applications []Application
	// KeyReuse lists keys that came back with a different body.
	KeyReuse []string
	Counts   Counts
}

// Server is the service. Its zero value is not usable; call New.
type Server struct {
	faults Faults
	broken Broken
	mux    *http.ServeMux

	mu   sync.Mutex
	rng  *rand.Rand
	eps  map[string]*endpointState
	next int
	// cured holds digests of poisoned bodies the service accepts now.
	cured map[string]bool
}

type endpointState struct {
	rec   EndpointRecord
	byKey map[string][]int // key -> indexes into rec.Applications
}

// New serves endpoints with faults; seed fixes the random draws' sequence.
func New(endpoints []Endpoint, f Faults, broken Broken, seed uint64) *Server {
	s := &Server{
		faults: f, broken: broken, mux: http.NewServeMux(),
		rng: rand.New(rand.NewPCG(seed, seed^0x51ed2701)),
		eps: map[string]*endpointState{}, cured: map[string]bool{},
	}
	for _, ep := range endpoints {
		s.eps[ep.Name] = &endpointState{rec: EndpointRecord{Endpoint: ep}, byKey: map[string][]int{}}
		s.mux.Handle("POST /"+ep.Name+"/effects", s.handleEffect(ep.Name))
		if ep.Lookup {
			s.mux.Handle("GET /"+ep.Name+"/effects/{key}", s.handleLookup(ep.Name))
		}
	}
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Records returns a copy of every endpoint's history, sorted by name.
func (s *Server) Records() []EndpointRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]EndpointRecord, 0, len(s.eps))
	for _, st := range s.eps {
		rec := st.rec
		rec.Applications = append([]Application(nil), st.rec.Applications...)
		rec.KeyReuse = append([]string(nil), st.rec.KeyReuse...)
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint.Name < out[j].Endpoint.Name })
	return out
}

// Applied answers what an operator would ask the provider's own console:
// did an effect under key take place on endpoint, and under which result
// id (the first, when there were several).
func (s *Server) Applied(endpoint, key string) (resultID string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.eps[endpoint]
	if st == nil || len(st.byKey[key]) == 0 {
		return "", false
	}
	return st.rec.Applications[st.byKey[key][0]].ResultID, true
}

// Cure makes the service accept the poisoned body with this digest from
// now on, as a provider does once the fault that refused it is fixed: the
// operator's step before replaying a dead letter.
func (s *Server) Cure(bodySHA256 string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cured[bodySHA256] = true
}

func (s *Server) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	return s.rng.Float64() < p
}

type poisonMark struct {
	Poison string `json:"poison"`
}

func (s *Server) handleEffect(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if key == "" || err != nil {
			http.Error(w, "an Idempotency-Key and a body under 1 MiB are required", http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		app := Application{
			Key: key, BodySHA256: hex.EncodeToString(sum[:]), TraceID: traceID(r.Header.Get("traceparent")),
			Fence: r.Header.Get("X-Ackgate-Fence"), At: time.Now(),
		}
		var mark poisonMark
		_ = json.Unmarshal(body, &mark) // a body that is not JSON carries no mark

		s.mu.Lock()
		st := s.eps[name]
		st.rec.Counts.Calls++
		switch {
		case (mark.Poison == "terminal" || mark.Poison == "retryable") && !s.cured[app.BodySHA256]:
			st.rec.Counts.PoisonRefusals++
			s.mu.Unlock()
			status := http.StatusUnprocessableEntity
			if mark.Poison == "retryable" {
				status = http.StatusServiceUnavailable
			}
			http.Error(w, "poisoned: refused, nothing applied", status)
			return
		case s.chance(s.faults.Status5xx):
			st.rec.Counts.Injected5xx++
			s.mu.Unlock()
			http.Error(w, "injected failure, nothing applied", http.StatusServiceUnavailable)
			return
		}
		id, status, ok := s.apply(st, app)
		if !ok {
			s.mu.Unlock()
			http.Error(w, "Idempotency-Key reused with a different body", http.StatusUnprocessableEntity)
			return
		}
		lose, slow := s.chance(s.faults.LoseResponse), false
		if lose {
			st.rec.Counts.LostResponses++
		} else if slow = s.chance(s.faults.Slow); slow {
			st.rec.Counts.SlowResponses++
		}
		s.mu.Unlock()

		if lose {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		if slow {
			select {
			case <-time.After(s.faults.SlowDelay):
			case <-r.Context().Done():
				return // the caller left; the effect stays applied
			}
		}
		w.Header().Set("X-Result-Id", id)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, "{\"id\":%q}\n", id)
	})
}

// apply records the effect under s.mu and returns its result id and status;
// ok is false for a deduplicating endpoint's key reused with another body.
func (s *Server) apply(st *endpointState, app Application) (id string, status int, ok bool) {
	if st.rec.Endpoint.Dedupe {
		if idx := st.byKey[app.Key]; len(idx) > 0 {
			first := st.rec.Applications[idx[0]]
			if first.BodySHA256 != app.BodySHA256 {
				st.rec.KeyReuse = append(st.rec.KeyReuse, app.Key)
				st.rec.Counts.KeyReuse++
				return "", 0, false
			}
			st.rec.Counts.Replayed++
			return first.ResultID, http.StatusOK, true
		}
	}
	if s.broken == Lie {
		s.next++
		return fmt.Sprintf("fx-%s-%d", st.rec.Endpoint.Name, s.next), http.StatusCreated, true
	}
	times := 1
	if s.broken == DoubleApply {
		times = 2
	}
	for range times {
		s.next++
		app.ResultID = fmt.Sprintf("fx-%s-%d", st.rec.Endpoint.Name, s.next)
		st.byKey[app.Key] = append(st.byKey[app.Key], len(st.rec.Applications))
		st.rec.Applications = append(st.rec.Applications, app)
		st.rec.Counts.Applied++
	}
	return app.ResultID, http.StatusCreated, true
}

func (s *Server) handleLookup(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		s.mu.Lock()
		st := s.eps[name]
		st.rec.Counts.Lookups++
		if s.chance(s.faults.LookupDown) {
			st.rec.Counts.LookupsDown++
			s.mu.Unlock()
			http.Error(w, "injected lookup failure", http.StatusServiceUnavailable)
			return
		}
		idx := st.byKey[key]
		var id string
		if len(idx) > 0 {
			id = st.rec.Applications[idx[0]].ResultID
		}
		s.mu.Unlock()
		if id == "" {
			http.Error(w, "no effect with that key", http.StatusNotFound)
			return
		}
		w.Header().Set("X-Result-Id", id)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "{\"id\":%q}\n", id)
	})
}

// traceID takes the trace id out of a W3C traceparent, or "".
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}
