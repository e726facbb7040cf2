package downstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/tracecarrier"
)

// Headers every downstream call carries. A provider dedupes on the
// idempotency key; the fence and operation id let it (and an operator reading
// its logs) tie a request to the ledger's attempt.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderFence          = "X-Ackgate-Fence"
	HeaderOperation      = "X-Ackgate-Operation"
)

const userAgent = "ackgate"

// idleConnsPerHost is how many keep-alive connections to one downstream stay
// open between calls: about as many as calls a busy gateway has in flight.
const idleConnsPerHost = 64

// connBufferSize sizes each downstream connection's read and write buffers.
// An effect request's headers and a small body fit in it, and so do the
// status line and headers of an answer; a larger body bypasses the write
// buffer and a longer header line is read in pieces, so nothing depends on
// it but the number of system calls. Go's default is 4 KiB each, which at a
// thousand calls in flight held 8 MB of buffers, mostly empty.
const connBufferSize = 2 << 10

// Options configures a Client.
type Options struct {
	// Transport is the base for the client's transport. It is cloned, so the
	// changes New makes never reach the caller's other clients. Nil means
	// http.DefaultTransport.
	Transport *http.Transport
	// TracerProvider and Propagators, when set, give each call a client span
	// and put its trace context on the request, so the downstream's own spans
	// join the delivery's trace.
	TracerProvider trace.TracerProvider
	Propagators    propagation.TextMapPropagator
}

// Client performs effect calls and lookups over HTTP.
type Client struct {
	transport *http.Transport
	http      *http.Client
	// fresh never reuses a connection; unsafe effects go through it.
	fresh *http.Client
	// tracer is nil without a TracerProvider; propagators may be nil.
	tracer      trace.Tracer
	propagators propagation.TextMapPropagator
	// propagatedFields is how many headers the propagators may add to a
	// request, so that setHeaders sizes the header map for them too.
	propagatedFields int
}

// tracerName is the instrumentation scope of the client spans.
const tracerName = "github.com/ackgate/ackgate/downstream"

var _ gate.Effects = (*Client)(nil)

// New returns a Client whose transport cannot resend an effect request on its
// own.
//
// The transport speaks HTTP/1.1 only. Its retry rules for a request without
// GetBody are the ones newEffectRequest relies on and the package's tests
// prove; HTTP/2 has its own retry paths (refused streams, GOAWAY) that would
// need their own proof before they could be trusted with an unsafe effect.
//
// Redirects are not followed: a redirect would be a request the gate did not
// decide, to a URL the route does not name. A 3xx is classified like any
// other status.
func New(opts Options) *Client {
	base := opts.Transport
	if base == nil {
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			base = dt
		} else {
			base = &http.Transport{Proxy: http.ProxyFromEnvironment}
		}
	}
	t := base.Clone()
	http1Only(t)
	// Concurrent deliveries to one downstream each hold a connection. The
	// default keeps two idle per host and closes the rest after every call,
	// so under load almost every call paid a new TCP connection on both
	// sides. A base that sets its own limit keeps it.
	if t.MaxIdleConnsPerHost == 0 {
		t.MaxIdleConnsPerHost = idleConnsPerHost
	}
	if t.MaxIdleConns != 0 && t.MaxIdleConns < t.MaxIdleConnsPerHost {
		t.MaxIdleConns = t.MaxIdleConnsPerHost
	}
	if t.ReadBufferSize == 0 {
		t.ReadBufferSize = connBufferSize
	}
	if t.WriteBufferSize == 0 {
		t.WriteBufferSize = connBufferSize
	}
	// Unsafe effects get a connection of their own per call. On a reused
	// keep-alive connection, a server closing it as idle at the moment the
	// request goes out looks exactly like "sent, answer lost"; for an unsafe
	// effect that means the operator lane, for nothing. A fresh connection
	// costs a handshake and removes that race.
	fresh := t.Clone()
	fresh.DisableKeepAlives = true
	c := &Client{
		transport:   t,
		http:        newHTTPClient(t),
		fresh:       newHTTPClient(fresh),
		propagators: opts.Propagators,
	}
	if opts.TracerProvider != nil {
		c.tracer = opts.TracerProvider.Tracer(tracerName)
	}
	if opts.Propagators != nil {
		c.propagatedFields = len(opts.Propagators.Fields())
	}
	return c
}

func newHTTPClient(t *http.Transport) *http.Client {
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// startCall starts a call's client span; sendCall puts the call's target on
// it and its trace context on the request, so the downstream's spans join
// the delivery's trace.
//
// The client does this itself rather than through otelhttp's transport,
// whose RoundTrip builds attribute sets for HTTP metrics the gateway does
// not export, on every call, in frames deep enough to grow the stack of
// every delivery goroutine past 16 KiB (measured at 1,000 in flight: about
// 900 goroutines at 32 KiB, 13 MiB more than they need). It also leaves the
// request and its body untouched, so nothing here can make it replayable.
func (c *Client) startCall(ctx context.Context, method string) (context.Context, trace.Span) {
	if c.tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span
	}
	k, ok := callKinds[method]
	if !ok {
		k = newCallKind(method)
	}
	return c.tracer.Start(ctx, k.spanName, k.spanOptions...)
}

// callKind is what starting a client span for one method takes: its name,
// and its options (the kind, the method attribute).
type callKind struct {
	spanName    string
	spanOptions []trace.SpanStartOption
}

// callKinds are the call kinds of the methods effects use, built once
// instead of per call: the name, the boxed options and their slice were
// allocations on every call. The options are values the tracer only reads
// (trace.NewSpanStartConfig copies them into a config of its own), so one
// slice serves every call at once.
var callKinds = func() map[string]callKind {
	m := map[string]callKind{}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodGet, http.MethodDelete} {
		m[method] = newCallKind(method)
	}
	return m
}()

// newCallKind builds method's call kind: at init for the methods in
// callKinds, per call for any other.
func newCallKind(method string) callKind {
	return callKind{
		spanName: "HTTP " + method,
		spanOptions: []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("http.request.method", method)),
		},
	}
}

// traceCall describes r's target on its span, from the URL the request
// already parsed, and injects the span's trace context into r's headers.
func (c *Client) traceCall(span trace.Span, r *http.Request) {
	if span.IsRecording() {
		// The address and path only: a query or user info may hold a
		// credential. One SetAttributes call, whose argument slice is one
		// allocation, where a call for the port took a second.
		attrs := [3]attribute.KeyValue{attribute.String("server.address", r.URL.Hostname()), attribute.String("url.path", r.URL.Path)}
		n := 2
		if port, err := strconv.Atoi(r.URL.Port()); err == nil {
			attrs[n] = attribute.Int("server.port", port)
			n++
		}
		span.SetAttributes(attrs[:n]...)
	}
	if c.propagators != nil {
		c.propagators.Inject(r.Context(), tracecarrier.Header(r.Header))
	}
}

// endCall ends a call's span with what came back: the status, or the
// error for a call without one. A client span counts 4xx and 5xx as errors.
func endCall(span trace.Span, resp *http.Response, err error) {
	if span.IsRecording() {
		switch {
		case err != nil:
			span.SetAttributes(attribute.String("error.type", errorType(err)))
			span.SetStatus(codes.Error, describe(err))
		case resp != nil:
			// One SetAttributes call per answer: each call's argument
			// slice is an allocation.
			status := attribute.Int("http.response.status_code", resp.StatusCode)
			if resp.StatusCode >= 400 {
				span.SetAttributes(status, attribute.String("error.type", strconv.Itoa(resp.StatusCode)))
				span.SetStatus(codes.Error, "")
			} else {
				span.SetAttributes(status)
			}
		}
	}
	span.End()
}

// errorType is the error.type of a call without a response: low
// cardinality, never the error's text.
func errorType(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "_OTHER"
}

// http1Only takes HTTP/2 off a transport on every path by which it could come
// back: the protocol set, an h2 handler copied from a configured base, and an
// "h2" ALPN offer left in the TLS config (with which the server would pick
// HTTP/2 and the client would then speak HTTP/1.1 to it).
func http1Only(t *http.Transport) {
	var protos http.Protocols
	protos.SetHTTP1(true)
	t.Protocols = &protos
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	if t.TLSClientConfig != nil {
		// Transport.Clone cloned the tls.Config, but its NextProtos slice is
		// still the caller's.
		t.TLSClientConfig.NextProtos = slices.DeleteFunc(slices.Clone(t.TLSClientConfig.NextProtos),
			func(p string) bool { return p == "h2" })
	}
}

// CloseIdleConnections releases pooled connections, for shutdown and tests.
func (c *Client) CloseIdleConnections() { c.transport.CloseIdleConnections() }

// Execute makes one effect call and classifies the answer. It never retries:
// a retry is a new attempt, and only the gate may decide on one.
func (c *Client) Execute(ctx context.Context, req *gate.EffectRequest) gate.EffectResult {
	spec := &req.Route.Effect
	enc, err := encodeBody(req.Route, req.Message)
	if err != nil {
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: bound("not sent: " + err.Error())}
	}
	callCtx, cancel := withTimeout(ctx, spec.Timeout)
	defer cancel()

	call := newEffectCall(enc.data)
	m := method(spec.Method)
	callCtx, span := c.startCall(callCtx, m)
	hreq, err := newEffectRequest(httptrace.WithClientTrace(callCtx, &call.hooks), m, spec.URL, &call.body)
	if err != nil {
		endCall(span, nil, err)
		// The error text would quote the URL; say only what was wrong.
		return gate.EffectResult{Outcome: gate.OutcomeRetryable, Reason: "not sent: effect method or url is invalid"}
	}
	setHeaders(hreq, spec, req, enc, c.propagatedFields)
	c.traceCall(span, hreq)

	hc := c.http
	if req.Route.Shape == gate.ShapeUnsafe {
		hc = c.fresh
	}
	resp, err := hc.Do(hreq)
	defer func() { endCall(span, resp, err) }()
	if err != nil {
		outcome, reason := lost(ctx, spec, &call.sent, err)
		return gate.EffectResult{Outcome: outcome, Reason: bound(reason)}
	}
	defer drainClose(resp.Body)

	if !is2xx(resp.StatusCode) {
		outcome, reason := classifyStatus(spec, resp.StatusCode)
		return gate.EffectResult{Outcome: outcome, StatusCode: resp.StatusCode, Reason: bound(reason)}
	}
	id, ok, reason := resultID(spec, resp)
	if !ok {
		return gate.EffectResult{
			Outcome:    gate.OutcomeUnknown,
			StatusCode: resp.StatusCode,
			Reason:     bound(fmt.Sprintf("status %d without evidence: %s", resp.StatusCode, reason)),
		}
	}
	return gate.EffectResult{Outcome: gate.OutcomeConfirmed, StatusCode: resp.StatusCode, ResultID: id}
}

// Lookup asks the route's lookup endpoint whether the effect for the
// idempotency key exists. Only a 404 counts as "definitely absent", because
// absence is what licenses another attempt; every other failure is unknown.
//
// A lookup is a GET without a body, which net/http may resend after a broken
// reused connection. That is harmless: a lookup reads, it does not apply.
func (c *Client) Lookup(ctx context.Context, req *gate.EffectRequest) gate.LookupResult {
	spec := &req.Route.Effect
	if spec.LookupURL == "" {
		return gate.LookupResult{Outcome: gate.OutcomeUnknown, Reason: "route has no lookup url"}
	}
	callCtx, cancel := withTimeout(ctx, spec.Timeout)
	defer cancel()

	u := strings.ReplaceAll(spec.LookupURL, "{key}", escapeKey(req.IdempotencyKey))
	callCtx, span := c.startCall(callCtx, http.MethodGet)
	hreq, err := http.NewRequestWithContext(callCtx, http.MethodGet, u, nil)
	if err != nil {
		endCall(span, nil, err)
		return gate.LookupResult{Outcome: gate.OutcomeUnknown, Reason: "lookup url is invalid"}
	}
	setHeaders(hreq, spec, req, body{}, c.propagatedFields)
	c.traceCall(span, hreq)

	resp, err := c.http.Do(hreq)
	defer func() { endCall(span, resp, err) }()
	if err != nil {
		return gate.LookupResult{Outcome: gate.OutcomeUnknown, Reason: bound("lookup failed: " + timeoutOr(ctx, spec, err))}
	}
	defer drainClose(resp.Body)

	switch resp.StatusCode {
	case http.StatusOK:
		id, ok, reason := resultID(spec, resp)
		if !ok {
			return gate.LookupResult{
				Outcome:    gate.OutcomeUnknown,
				StatusCode: resp.StatusCode,
				Reason:     bound("lookup found the effect without evidence: " + reason),
			}
		}
		return gate.LookupResult{Outcome: gate.OutcomeConfirmed, StatusCode: resp.StatusCode, ResultID: id}
	case http.StatusNotFound:
		return gate.LookupResult{Outcome: gate.OutcomeAbsent, StatusCode: resp.StatusCode}
	default:
		return gate.LookupResult{
			Outcome:    gate.OutcomeUnknown,
			StatusCode: resp.StatusCode,
			Reason:     fmt.Sprintf("lookup answered status %d", resp.StatusCode),
		}
	}
}

// newEffectRequest builds a request the Transport can never resend by itself.
//
// net/http's Transport retries a request on a fresh connection when a reused
// one breaks (shouldRetryRequest in transport.go). After bytes were written it
// does so only for a "replayable" request (Request.isReplayable): one whose
// body is nil, http.NoBody, or comes with a GetBody — and an Idempotency-Key
// header makes any method count as idempotent. When nothing was written it
// retries if the outgoing length is 0 or GetBody is set.
//
// So the body is always present, never http.NoBody, always wrapped so that
// http.NewRequest does not recognise it (it would install a GetBody for a
// bare *bytes.Reader and friends; requestBody), and GetBody stays nil. An
// empty body has ContentLength 0, which net/http reads as "unknown" for a
// non-nil body and sends chunked; that is the price of keeping an empty
// effect request unreplayable.
func newEffectRequest(ctx context.Context, method, target string, body *bytes.Reader) (*http.Request, error) {
	r, err := http.NewRequestWithContext(ctx, method, target, requestBody(body))
	if err != nil {
		return nil, err
	}
	r.ContentLength = body.Size()
	r.GetBody = nil
	return r, nil
}

// Header names setHeaders writes without http.Header.Set, in the canonical
// form Set would give them (the tests check that they are).
const (
	headerUserAgent   = "User-Agent"
	headerContentType = "Content-Type"
)

// setHeaders gives r, fresh from http.NewRequestWithContext, its header:
// the configured headers, the body's, and the ones that tie the request to
// its attempt, with the precedence the comments below give. more is how
// many headers something else (the propagators) adds afterwards.
//
// It stores what http.Header.Set would, key by key, but with every value it
// sets in one allocation (headerValues) rather than one each, and, for a
// header of more than smallHeader entries, in a map sized once for all of
// them instead of the empty one NewRequest made regrowing on the way.
func setHeaders(r *http.Request, spec *gate.EffectSpec, req *gate.EffectRequest, b body, more int) {
	// The values set here: User-Agent, Content-Type, the configured
	// headers, the attributes and the three gate headers.
	const gateHeaders = 3
	own := 2 + len(spec.Headers) + len(b.attrs) + gateHeaders
	if n := own + len(b.headers) + more; n > smallHeader {
		r.Header = make(http.Header, n)
	}
	h := r.Header
	vals := make(headerValues, 0, own)

	h[headerUserAgent] = vals.one(userAgent)
	if b.contentType != "" {
		h[headerContentType] = vals.one(b.contentType)
	}
	for k, v := range spec.Headers {
		switch {
		case strings.EqualFold(k, "Host"):
			r.Host = v // net/http ignores a Host entry in Header
		case b.owned && (strings.EqualFold(k, "Content-Type") || len(k) > 3 && strings.EqualFold(k[:3], "ce-")):
			// A CloudEvent's encoding defines the media type and the
			// ce-* headers; configured ones would misdescribe the event.
		default:
			h[http.CanonicalHeaderKey(k)] = vals.one(v)
		}
	}
	// The body's own headers (attributes, the event's context) after the
	// configured ones, which cannot replace them.
	for k, vs := range b.headers {
		h[k] = vs
	}
	for name, v := range b.attrs {
		h[attributeHeaderKey(name)] = vals.one(attributeHeaderValue(v))
	}
	// Set last so configuration cannot override what ties the request to
	// its attempt.
	h[HeaderIdempotencyKey] = vals.one(req.IdempotencyKey)
	h[HeaderFence] = vals.one(strconv.FormatInt(req.Fence, 10))
	h[HeaderOperation] = vals.one(req.OperationID)
}

// smallHeader is how many entries a map holds before it first grows (one
// group of the runtime's maps, as of Go 1.24). Up to that, the empty map
// NewRequest made costs no more than a sized one, which would only waste it
// (measured by BenchmarkExecute: one allocation more per call); beyond it,
// a sized map saves the regrowth's rehash and the outgrown memory (about
// 300 bytes a call). Only the cost depends on it, never the header.
const smallHeader = 8

// headerValues hands out one-value header value slices from one backing
// array. Each has capacity 1, as the []string{v} of http.Header.Set has, so
// an Add to one header reallocates instead of writing into its neighbour's.
// Handing out more than the capacity is still correct: append moves on to
// a new array and the slices already handed out keep the old one.
type headerValues []string

// one appends s and returns it as a header's value slice of capacity 1.
func (v *headerValues) one(s string) []string {
	*v = append(*v, s)
	n := len(*v)
	return (*v)[n-1 : n : n]
}

// effectCall is the state of one effect call that outlives the stack frame,
// in one allocation where it took three: how far the request got, the trace
// hooks that record it, and the request body. (The two hook closures are
// allocations of their own, as they were.)
//
// The hooks cannot be built once per client: they record into this call's
// sendTrace, and httptrace.WithClientTrace writes into the ClientTrace it
// is given when the context already carries one (composing the two). Nor
// can the struct be reused for a later call: WroteRequest runs on the
// connection's writer goroutine and can still come after Do has returned
// (a response, or a cancellation, before the whole request was written).
type effectCall struct {
	sent  sendTrace
	hooks httptrace.ClientTrace
	body  bytes.Reader
}

// newEffectCall returns the state of a call that sends data, its hooks
// bound to its own sendTrace.
func newEffectCall(data []byte) *effectCall {
	c := &effectCall{}
	c.body.Reset(data)
	c.hooks = c.sent.hooks()
	return c
}

// sendTrace records how far a request got. GotConn is called on the caller's
// goroutine before the request is handed to the connection's writer, so once
// Do has returned, "no connection" reliably means "nothing was sent".
type sendTrace struct {
	gotConn atomic.Bool
	wrote   atomic.Bool
}

// hooks are the trace hooks that record into s; effectCall keeps them next
// to s, so that the two are one allocation.
func (s *sendTrace) hooks() httptrace.ClientTrace {
	return httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { s.gotConn.Store(true) },
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				s.wrote.Store(true)
			}
		},
	}
}

// lost classifies a call that ended without a response. Only a request that
// never got a connection is retryable: once it has one, some or all of it may
// have reached the provider, and a provider may apply a request whose response
// it never manages to send.
func lost(parent context.Context, spec *gate.EffectSpec, tr *sendTrace, err error) (gate.Outcome, string) {
	what := timeoutOr(parent, spec, err)
	switch {
	case !tr.gotConn.Load():
		return gate.OutcomeRetryable, "not sent: " + what
	case tr.wrote.Load():
		return gate.OutcomeUnknown, "sent, no answer: " + what + "; the effect may have been applied"
	default:
		return gate.OutcomeUnknown, "lost while sending: " + what + "; the effect may have been applied"
	}
}

// timeoutOr describes err, telling the route's own timeout from the caller's
// deadline (the lease) because they call for different fixes.
func timeoutOr(parent context.Context, spec *gate.EffectSpec, err error) string {
	if !errors.Is(err, context.DeadlineExceeded) {
		return describe(err)
	}
	if parent.Err() == nil && spec.Timeout > 0 {
		return fmt.Sprintf("effect timeout (%s) reached", spec.Timeout)
	}
	return "caller deadline reached"
}

// withTimeout applies the route's timeout under the caller's deadline; the
// sooner of the two wins.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

func method(m string) string {
	if m == "" {
		return http.MethodPost
	}
	return strings.ToUpper(m)
}

// escapeKey escapes a key for either a path segment or a query value: query
// escaping, with spaces as %20 because a "+" in a path is a literal plus.
func escapeKey(k string) string {
	return strings.ReplaceAll(url.QueryEscape(k), "+", "%20")
}
