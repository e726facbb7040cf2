package handlers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/admincred"
	"github.com/ackgate/ackgate/internal/authlimit"
)

// EvidenceStore is the ledger's read side as the admin API needs it. Get
// answers gate.ErrNotFound for an unknown id; List answers
// adminapi.ErrInvalidFilter for a filter it cannot apply.
type EvidenceStore interface {
	Get(ctx context.Context, id string) (*adminapi.Record, error)
	List(ctx context.Context, f adminapi.ListFilter) ([]gate.Operation, string, error)
}

// AdminOptions wires the admin listener.
type AdminOptions struct {
	// Credentials are the named bearer tokens an admin request may carry;
	// a resolution or replay is recorded under the name of the one it
	// carried. Token alone (GATEWAY_ADMIN_TOKEN) is the credential admin.
	Credentials *admincred.Set
	Token       string
	Evidence    EvidenceStore
	Routes      []*gate.Route
	Logger      *slog.Logger
	// Poison lists the messages kept as poison (GET /v1/poison).
	Poison PoisonStore
	// Metrics serves GET /metrics (Prometheus), behind an admin credential
	// or, when set, MetricsToken, which opens /metrics and nothing else.
	Metrics      http.Handler
	MetricsToken string
	// AuthFailures counts requests refused for their credential; optional.
	AuthFailures AuthFailureRecorder
	// AuthLimiter bounds failed credential checks per client address and
	// overall; share one with the console. Nil gets one of
	// authlimit.DefaultLimits for this listener alone.
	AuthLimiter *authlimit.Limiter
	// Resolver applies operators' resolutions and replays; without it they
	// answer 503.
	Resolver Resolver
	// DeadLetters lists terminal records (GET /v1/dead-letters).
	DeadLetters DeadLetterStore
	// Outbox makes handoff entries due at once (POST /v1/outbox/{id}/retry);
	// without it that answers 503. Cancelling goes through Resolver.
	Outbox OutboxActions

	refusals *refusalLog
	metrics  *admincred.Set
}

// NewAdmin returns the admin listener's handler: evidence records and route
// contracts, behind named bearer tokens, on a listener brokers never reach.
func NewAdmin(o AdminOptions) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, http.StatusNotFound, "metrics are not enabled in this process")
		})
	}
	if o.Credentials == nil && o.Token != "" {
		o.Credentials, _ = admincred.New(admincred.FromToken(admincred.AdminName, o.Token))
	}
	if o.MetricsToken != "" {
		o.metrics, _ = admincred.New(admincred.FromToken(metricsCredential, o.MetricsToken))
	}
	if o.AuthLimiter == nil {
		o.AuthLimiter = authlimit.New(authlimit.DefaultLimits(), nil)
	}
	o.refusals = newRefusalLog(time.Now)
	r := chi.NewRouter()
	addAdminRoutes(r, &o)
	return r
}

type problem struct {
	Error string `json:"error"`
}

func writeProblem(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, problem{Error: msg})
}

// buildRecord is the ledger's rows as an operator reads them: each evidence
// field named, the completion statement, and the route's contract as the admin
// API shows it.
func buildRecord(rec *adminapi.Record, routes []*gate.Route) adminapi.EvidenceRecord {
	op := rec.Operation
	ev := adminapi.EvidenceFields{
		ReceiveCount: op.DeliveryCount, OperationScope: op.ScopeKey,
		SemanticFingerprint: op.Fingerprint, MessageSchemaVersion: op.FingerprintVersion,
		LeaseStart: op.LeaseStart, LeaseDeadline: op.LeaseDeadline, LeaseExtensions: op.LeaseExtensions, LeaseLostAt: op.LeaseLostAt,
		OwnerToken: op.Owner, FencingVersion: op.Fence, IdempotencyKey: op.IdempotencyKey,
		ResultID: op.ResultID, EffectStatus: op.State, EvidenceTime: op.EvidenceAt,
		AckConfirmedTime: op.AckedAt, IndeterminateLane: op.Lane, RetentionExpiry: op.RetainUntil,
		TraceID: op.TraceID, ContractVersion: gate.Contract(&op),
	}
	if n := len(rec.Deliveries); n > 0 {
		ev.DeliveryID = rec.Deliveries[0].MessageID
	}
	if op.LastAttempt != nil {
		ev.EffectAttemptID = op.ID + "/" + strconv.Itoa(op.LastAttempt.N)
	}
	if op.State == gate.StateTerminalFailure || op.State == gate.StateConflicting || op.State == gate.StatePendingEffect || op.State == gate.StateEffectIndeterminate {
		ev.NegativeOrDeadLetter = op.Reason
	}
	if op.State == gate.StateTerminalFailure || op.State == gate.StateConflicting {
		// A replayed operation keeps its dead letter row (the log is
		// append-only) but is no longer out of circulation.
		for _, dl := range rec.DeadLetters {
			ev.NegativeOrDeadLetter = "dead-lettered by the gateway: " + dl.Reason
		}
	}
	if n := len(rec.Interventions); n > 0 {
		s := interventionSummary(&rec.Interventions[n-1])
		ev.ManualIntervention = &s
	}
	ev.TransitionTimes = make([]adminapi.TransitionAt, 0, len(rec.Events))
	for _, e := range rec.Events {
		ev.TransitionTimes = append(ev.TransitionTimes, adminapi.TransitionAt{To: e.To, At: e.At, Fence: e.Fence})
	}
	out := adminapi.EvidenceRecord{
		Operation: op, Evidence: ev, Statement: statement(&op, rec.Interventions),
		Deliveries: nonNil(rec.Deliveries), Attempts: nonNil(rec.Attempts),
		Transitions: nonNil(rec.Events), DeadLetters: nonNil(rec.DeadLetters),
		ManualInterventions: nonNil(rec.Interventions), LeaseEvents: nonNil(rec.LeaseEvents),
	}
	if op.ConflictOf != "" {
		out.Links = map[string]string{"conflict_of": "/v1/operations/" + op.ConflictOf}
	}
	for _, r := range routes {
		if r.Name == op.Route {
			out.Contract = contractView(r)
		}
	}
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func handleGetOperation(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := operationID(w, r)
		if !ok {
			return
		}
		rec, err := o.Evidence.Get(r.Context(), id)
		if errors.Is(err, gate.ErrNotFound) {
			writeProblem(w, http.StatusNotFound, "no operation "+strconv.Quote(id))
			return
		}
		if err != nil {
			o.Logger.ErrorContext(r.Context(), "reading evidence failed", "operation_id", id, "err", err)
			writeProblem(w, http.StatusServiceUnavailable, "evidence store unavailable")
			return
		}
		writeJSON(w, http.StatusOK, buildRecord(rec, o.Routes))
	}
}

const maxListLimit = 500

// pageLimit reads a listing's optional limit (0 when absent: the store's
// default). When it is not 1 to maxListLimit it writes the 400 and ok is
// false.
func pageLimit(w http.ResponseWriter, q url.Values) (n int, ok bool) {
	v := q.Get("limit")
	if v == "" {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxListLimit {
		writeProblem(w, http.StatusBadRequest, fmt.Sprintf("limit must be an integer from 1 to %d", maxListLimit))
		return 0, false
	}
	return n, true
}

// listFailed answers a listing's store error, if there is one: a cursor the
// store cannot apply is the caller's 400, anything else a logged 503.
func listFailed(w http.ResponseWriter, r *http.Request, o *AdminOptions, what string, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, adminapi.ErrInvalidFilter):
		writeProblem(w, http.StatusBadRequest, "cursor is not valid")
	default:
		o.Logger.ErrorContext(r.Context(), "listing "+what+" failed", "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "evidence store unavailable")
	}
	return true
}

func handleListOperations(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		f := adminapi.ListFilter{
			Route: q.Get("route"), State: q.Get("state"), MessageID: q.Get("message_id"),
			Key: q.Get("key"), Cursor: q.Get("cursor"),
		}
		if f.State != "" && !gate.State(f.State).Valid() {
			writeProblem(w, http.StatusBadRequest, "state must be one of: "+joinStates())
			return
		}
		var ok bool
		if f.Limit, ok = pageLimit(w, q); !ok {
			return
		}
		if msg := checkQueryText(map[string]string{"route": f.Route, "message_id": f.MessageID, "key": f.Key, "cursor": f.Cursor}); msg != "" {
			writeProblem(w, http.StatusBadRequest, msg)
			return
		}
		if f.Key != "" {
			f.ByKey = adminapi.ByKey(o.Routes, f.Route, f.Key)
		}
		if f.MessageID != "" {
			f.ByMessage = adminapi.ByMessage(o.Routes, f.Route, f.MessageID)
		}
		ops, next, err := o.Evidence.List(r.Context(), f)
		if listFailed(w, r, o, "operations", err) {
			return
		}
		writeJSON(w, http.StatusOK, adminapi.OperationList{Operations: nonNil(ops), NextCursor: next})
	}
}

// maxQueryText bounds every free-text query parameter of the admin API.
const maxQueryText = 1024

// checkQueryText says what is wrong with the first free-text parameter that
// is too long or that Postgres text cannot hold (a NUL byte, invalid UTF-8),
// or "" when all are fine. Such a value can match nothing the ledger holds,
// and sent to it, it would fail the query as if the ledger were down.
func checkQueryText(params map[string]string) string {
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		v := params[name]
		if len(v) > maxQueryText {
			return "query parameter " + name + " is longer than 1024 characters"
		}
		if why := gate.Unstorable(v); why != "" {
			return "query parameter " + name + " " + why
		}
	}
	return ""
}

func joinStates() string {
	s := make([]string, len(gate.States))
	for i, st := range gate.States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func handleListRoutes(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		out := make([]*gate.Route, len(o.Routes))
		for i, r := range o.Routes {
			out[i] = contractView(r)
		}
		writeJSON(w, http.StatusOK, adminapi.RouteList{Routes: out})
	}
}

// contractView is a route as the admin API shows it: every contract field,
// but effect header values hidden, since they often carry credentials for the
// downstream.
func contractView(r *gate.Route) *gate.Route {
	c := *r
	if len(r.Effect.Headers) > 0 {
		c.Effect.Headers = make(map[string]string, len(r.Effect.Headers))
		for k := range r.Effect.Headers {
			c.Effect.Headers[k] = "(redacted)"
		}
	}
	return &c
}

func handleGetRoute(o *AdminOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := chi.URLParam(r, "name")
		for _, rt := range o.Routes {
			if rt.Name == name {
				writeJSON(w, http.StatusOK, contractView(rt))
				return
			}
		}
		writeProblem(w, http.StatusNotFound, "no route "+strconv.Quote(gate.Bound(name, 64)))
	}
}
