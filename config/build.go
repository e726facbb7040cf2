package config

import (
	"fmt"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ackgate/ackgate/gate"
)

var (
	routeNameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	pubsubSourceRE = regexp.MustCompile(`^projects/[^/\s]+/subscriptions/[^/\s]+$`)
	snsSourceRE    = regexp.MustCompile(`^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$`)
	headerNameRE   = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// reservedHeaders are set by the gateway on every effect call (or by
// net/http); a route may not override them. Idempotency-Key in particular is
// the gate's, and a second copy would also make net/http replay requests.
var reservedHeaders = []string{
	"Connection", "Content-Length", "Host", "Idempotency-Key", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "X-Idempotency-Key",
}

// routeErrs collects field errors for one route.
type routeErrs []error

func (e *routeErrs) add(field, format string, a ...any) {
	*e = append(*e, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
}

// duration parses an optional duration field; ok is false when it is absent
// or invalid (invalid ones are reported).
func (e *routeErrs) duration(field, raw string) (time.Duration, bool) {
	if raw == "" {
		return 0, false
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		e.add(field, "%q is not a duration (write it like \"10s\", \"30m\" or \"168h\")", raw)
		return 0, false
	}
	return d, true
}

// buildRoute applies defaults to spec and validates the result. Errors name
// the field; the caller adds the route.
func buildRoute(spec *routeSpec) (*gate.Route, []error) {
	var errs routeErrs
	r := &gate.Route{Name: spec.Name, Tenant: spec.Tenant}

	// Identity of the route.
	switch {
	case r.Name == "":
		errs.add("name", "required")
	case !routeNameRE.MatchString(r.Name):
		errs.add("name", "%q must be 1 to %d characters of a-z, 0-9, '-' and '_', starting with a letter or digit", r.Name, maxRouteNameLen)
	}
	if r.Tenant == "" {
		r.Tenant = DefaultTenant
	} else if !routeNameRE.MatchString(r.Tenant) {
		errs.add("tenant", "%q must be 1 to %d characters of a-z, 0-9, '-' and '_', starting with a letter or digit", r.Tenant, maxRouteNameLen)
	}
	var brokerOK bool
	r.Broker, brokerOK = brokers.parse(&errs, "broker", spec.Broker)
	r.Sources = sortedUnique(spec.Sources)
	for _, s := range r.Sources {
		switch r.Broker {
		case gate.BrokerPubSub:
			if !pubsubSourceRE.MatchString(s) {
				errs.add("sources", "%q is not a subscription name like projects/PROJECT/subscriptions/NAME", s)
			}
		case gate.BrokerSNS:
			switch {
			case !snsSourceRE.MatchString(s):
				errs.add("sources", "%q is not a topic ARN like arn:aws:sns:REGION:ACCOUNT:TOPIC", s)
			case strings.HasSuffix(s, ".fifo"):
				errs.add("sources", "%q is a FIFO topic, and FIFO topics cannot deliver to HTTP endpoints", s)
			}
		}
	}

	buildAuth(r, spec, &errs)
	buildKey(r, spec, &errs)
	buildFingerprint(r, spec, &errs)
	checkSignedIdentity(r, &errs)

	// Broker timing: the lease comes from the ack deadline.
	ack, ackSet := errs.duration("ack_deadline", spec.AckDeadline)
	switch r.Broker {
	case gate.BrokerPubSub:
		if !ackSet {
			ack = DefaultPubSubAckDeadline
		}
		if ack < MinPubSubAckDeadline || ack > MaxPubSubAckDeadline {
			errs.add("ack_deadline", "%s is outside Pub/Sub's range of %s to %s; use the subscription's ack deadline", ack, MinPubSubAckDeadline, MaxPubSubAckDeadline)
		}
	case gate.BrokerSNS:
		if ackSet && ack != SNSAckDeadline {
			errs.add("ack_deadline", "%s: SNS always waits %s for an HTTP delivery; leave ack_deadline out", ack, SNSAckDeadline)
		}
		ack = SNSAckDeadline
	}
	r.AckDeadline = ack

	var renewal renewalSpec
	if spec.Renewal != nil {
		renewal = *spec.Renewal
	}
	interval, ok := errs.duration("renewal.interval", renewal.Interval)
	if !ok {
		interval = ack / 3
	}
	maxExt, ok := errs.duration("renewal.max_extension", renewal.MaxExtension)
	if !ok {
		maxExt = ack
		if r.Broker == gate.BrokerSNS {
			maxExt = 0
		}
	}
	r.Renewal = gate.Renewal{Interval: interval, MaxExtension: maxExt}
	if interval <= 0 {
		errs.add("renewal.interval", "must be positive, got %s", interval)
	} else if brokerOK && interval >= ack {
		errs.add("renewal.interval", "%s must be shorter than ack_deadline (%s), or the lease lapses before it is renewed", interval, ack)
	}
	if maxExt < 0 {
		errs.add("renewal.max_extension", "must not be negative, got %s", maxExt)
	}

	// The shape decides what the effect is (a call, or a statement) and
	// which deadline bounds it.
	r.Shape, _ = shapes.parse(&errs, "shape", spec.Shape)
	if r.Shape == gate.ShapeLocal {
		buildLocal(r, spec, &errs)
	} else {
		buildEffect(r, spec, &errs)
		if spec.Local != nil {
			errs.add("local", "only applies to shape local, not %s", r.Shape)
		}
	}
	buildHandoff(r, spec, &errs)
	switch {
	case r.Shape == gate.ShapeHandoff:
		// The relay answers no broker: its call is bounded by its own
		// timeout, not by the lease a delivery holds.
	case r.Shape == gate.ShapeLocal:
		if brokerOK && r.Local != nil && r.Local.Timeout > ack+maxExt {
			errs.add("local.timeout", "%s is longer than ack_deadline + renewal.max_extension (%s): the broker would give up before the statement ends", r.Local.Timeout, ack+maxExt)
		}
	case brokerOK && r.Effect.Timeout > 0 && r.Effect.Timeout > ack+maxExt:
		errs.add("effect.timeout", "%s is longer than ack_deadline + renewal.max_extension (%s): the lease would lapse while the call still runs, and another replica could start the effect again", r.Effect.Timeout, ack+maxExt)
	}

	// The shape's settle policy.
	dedupe, dedupeSet := errs.duration("dedupe_window", spec.DedupeWindow)
	switch r.Shape {
	case gate.ShapeIdempotent:
		if !dedupeSet && spec.DedupeWindow == "" {
			errs.add("dedupe_window", "required for shape idempotent: how long the provider honours an idempotency key")
		} else if dedupeSet && dedupe <= 0 {
			errs.add("dedupe_window", "must be positive, got %s", dedupe)
		}
		r.DedupeWindow = dedupe
	case gate.ShapeHandoff:
		// Optional: a downstream that deduplicates lets the relay retry
		// after a lost response inside this window.
		if dedupeSet && dedupe <= 0 {
			errs.add("dedupe_window", "must be positive, got %s", dedupe)
		}
		r.DedupeWindow = dedupe
	case gate.ShapeLookup, gate.ShapeUnsafe, gate.ShapeRepeatable, gate.ShapeLocal:
		if spec.DedupeWindow != "" {
			errs.add("dedupe_window", "only applies to shapes idempotent and handoff, not %s", r.Shape)
		}
	}
	switch {
	case r.Shape == gate.ShapeLookup && r.Effect.LookupURL == "":
		errs.add("effect.lookup_url", "required for shape lookup")
	case r.Shape != gate.ShapeLookup && r.Shape != gate.ShapeHandoff && r.Effect.LookupURL != "" && r.Shape != "":
		errs.add("effect.lookup_url", "only applies to shapes lookup and handoff, not %s", r.Shape)
	}
	r.CommitBoundary = commitBoundary(r.Shape)

	buildReconcile(r, spec, &errs)

	// Retries and dead letters.
	r.MaxAttempts = DefaultMaxAttempts
	if spec.MaxAttempts != nil {
		r.MaxAttempts = *spec.MaxAttempts
	}
	if r.MaxAttempts < 1 || r.MaxAttempts > MaxAttemptsLimit {
		errs.add("max_attempts", "must be from 1 to %d, got %d", MaxAttemptsLimit, r.MaxAttempts)
	}
	r.DeadLetter, _ = deadLetters.parse(&errs, "dead_letter", spec.DeadLetter)
	if r.Shape == gate.ShapeHandoff && r.DeadLetter != gate.DeadLetterGateway && r.DeadLetter != "" {
		errs.add("dead_letter", "must be gateway for shape handoff: the broker was acked when the outbox entry committed, so only the gateway can hold what the relay gives up on")
	}

	buildRetention(r, spec, &errs)

	r.Private = sortedUnique(spec.Private)
	for _, p := range r.Private {
		if strings.TrimSpace(p) == "" {
			errs.add("private", "attribute names and JSON pointers must not be empty")
		}
	}
	// A key drawn from a private field is kept only as its keyed hash. An
	// entry is an attribute name or, starting with /, a JSON pointer into the
	// data, matched exactly against the key's name.
	if r.Key.Kind == gate.KeyAttribute || r.Key.Kind == gate.KeyJSONPointer {
		r.Key.Hashed = slices.Contains(r.Private, r.Key.Name)
	}
	return r, errs
}

// buildReconcile sets how the reconciler works a lookup route's
// indeterminate lane. Only lookup routes have one: an unsafe effect waits
// for a person, and the other shapes have no lookup to ask.
func buildReconcile(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	lookupHandoff := r.Shape == gate.ShapeHandoff && r.Effect.LookupURL != ""
	if r.Shape != gate.ShapeLookup && !lookupHandoff {
		if spec.Reconcile != nil && r.Shape != "" {
			errs.add("reconcile", "only applies to shape lookup (or handoff with a lookup_url), not %s: nothing but its lookup can settle an operation in the background", r.Shape)
		}
		return
	}
	var rs reconcileSpec
	if spec.Reconcile != nil {
		rs = *spec.Reconcile
	}
	p := gate.ReconcilePolicy{Interval: DefaultReconcileInterval, MaxInterval: DefaultReconcileMaxInterval,
		RatePerSecond: DefaultReconcileRate}
	if d, ok := errs.duration("reconcile.interval", rs.Interval); ok {
		p.Interval = d
	}
	if d, ok := errs.duration("reconcile.max_interval", rs.MaxInterval); ok {
		p.MaxInterval = d
	} else if rs.MaxInterval == "" && p.Interval > p.MaxInterval {
		p.MaxInterval = p.Interval
	}
	if rs.RatePerSecond != nil {
		p.RatePerSecond = *rs.RatePerSecond
	}
	switch {
	case p.Interval < MinReconcileInterval || p.Interval > MaxReconcileInterval:
		errs.add("reconcile.interval", "must be from %s to %s, got %s", MinReconcileInterval, MaxReconcileInterval, p.Interval)
	case p.MaxInterval < p.Interval || p.MaxInterval > MaxReconcileInterval:
		errs.add("reconcile.max_interval", "must be from reconcile.interval (%s) to %s, got %s", p.Interval, MaxReconcileInterval, p.MaxInterval)
	}
	if !(p.RatePerSecond > 0 && p.RatePerSecond <= MaxReconcileRate) {
		errs.add("reconcile.rate_per_second", "must be above 0 and at most %g, got %g", MaxReconcileRate, p.RatePerSecond)
	}
	r.Reconcile = p
}

func buildKey(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	var k keySpec
	if spec.OperationKey != nil {
		k = *spec.OperationKey
	}
	kind, _ := keyKinds.parse(errs, "operation_key.kind", k.Kind)
	r.Key = gate.KeySource{Kind: kind, Name: k.Name}
	switch {
	case kind == gate.KeyMessageID && k.Name != "" && k.Kind == "":
		errs.add("operation_key.kind", "required when a name is given: attribute or json_pointer")
	case kind == gate.KeyMessageID && k.Name != "":
		errs.add("operation_key.name", "must be empty for kind message_id")
	case kind == gate.KeyAttribute && k.Name == "":
		errs.add("operation_key.name", "required for kind attribute: the attribute that holds the key")
	case kind == gate.KeyJSONPointer && k.Name == "":
		errs.add("operation_key.name", "required for kind json_pointer: a pointer such as /order/id")
	case kind == gate.KeyJSONPointer && !strings.HasPrefix(k.Name, "/"):
		errs.add("operation_key.name", "JSON pointer %q must start with /", k.Name)
	}
}

func buildFingerprint(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	fp := fingerprintSpec{}
	if spec.Fingerprint != nil {
		fp = *spec.Fingerprint
	}
	r.Fingerprint = gate.FingerprintSpec{Version: DefaultFingerprintVer, Data: true}
	if fp.Version != nil {
		r.Fingerprint.Version = *fp.Version
	}
	if fp.Data != nil {
		r.Fingerprint.Data = *fp.Data
	}
	if r.Fingerprint.Version < 1 {
		errs.add("fingerprint.version", "must be 1 or more, got %d", r.Fingerprint.Version)
	}
	// The gate sorts attributes itself, so their order is not part of the
	// contract; pointer order is.
	r.Fingerprint.Attributes = sortedUnique(fp.Attributes)
	for _, a := range r.Fingerprint.Attributes {
		if strings.TrimSpace(a) == "" {
			errs.add("fingerprint.attributes", "attribute names must not be empty")
		}
	}
	r.Fingerprint.Pointers = slices.Clone(fp.Pointers)
	seen := map[string]bool{}
	for _, p := range r.Fingerprint.Pointers {
		switch {
		case !strings.HasPrefix(p, "/"):
			errs.add("fingerprint.pointers", "JSON pointer %q must start with /", p)
		case seen[p]:
			errs.add("fingerprint.pointers", "%q is listed twice", p)
		}
		seen[p] = true
	}
	if !r.Fingerprint.Data && len(r.Fingerprint.Attributes) == 0 && len(r.Fingerprint.Pointers) == 0 {
		errs.add("fingerprint", "covers nothing: with data: false, name attributes or pointers, or every payload would count as the same intent")
	}
}

func buildEffect(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	if spec.Effect == nil {
		errs.add("effect", "required: the downstream call that performs the route's effect")
		return
	}
	e := spec.Effect
	out := gate.EffectSpec{
		URL:             e.URL,
		ResultIDHeader:  e.ResultIDHeader,
		ResultIDPointer: e.ResultIDPointer,
		LookupURL:       e.LookupURL,
	}
	out.Method, _ = effectMethods.parse(errs, "effect.method", strings.ToUpper(e.Method))
	if e.URL == "" {
		errs.add("effect.url", "required")
	} else if err := checkHTTPURL(e.URL); err != nil {
		errs.add("effect.url", "%v", err)
	}
	out.BodyMode, _ = bodyModes.parse(errs, "effect.body_mode", e.BodyMode)
	if len(e.Headers) > 0 {
		out.Headers = make(map[string]string, len(e.Headers))
		for name, value := range e.Headers {
			canon := textproto.CanonicalMIMEHeaderKey(name)
			switch {
			case !headerNameRE.MatchString(name):
				errs.add("effect.headers", "%q is not a valid header name", name)
			case slices.Contains(reservedHeaders, canon):
				errs.add("effect.headers", "%s is set by the gateway and cannot be configured", canon)
			case strings.ContainsAny(value, "\r\n\x00"):
				errs.add("effect.headers", "value of %s contains a line break or NUL", canon)
			}
			if _, dup := out.Headers[canon]; dup {
				errs.add("effect.headers", "%s is given twice (header names are case-insensitive)", canon)
			}
			out.Headers[canon] = value
		}
	}
	out.Timeout = DefaultEffectTimeout
	if d, ok := errs.duration("effect.timeout", e.Timeout); ok {
		out.Timeout = d
		if d <= 0 {
			errs.add("effect.timeout", "must be positive, got %s", d)
		}
	}
	if out.ResultIDHeader != "" && !headerNameRE.MatchString(out.ResultIDHeader) {
		errs.add("effect.result_id_header", "%q is not a valid header name", out.ResultIDHeader)
	}
	if out.ResultIDPointer != "" && !strings.HasPrefix(out.ResultIDPointer, "/") {
		errs.add("effect.result_id_pointer", "JSON pointer %q must start with /", out.ResultIDPointer)
	}
	out.Evidence = effectEvidence(e, errs)
	if out.LookupURL != "" {
		if err := checkHTTPURL(strings.ReplaceAll(out.LookupURL, lookupKeyPlaceholder, "k")); err != nil {
			errs.add("effect.lookup_url", "%v", err)
		} else if !strings.Contains(out.LookupURL, lookupKeyPlaceholder) {
			errs.add("effect.lookup_url", "must contain %s, where the idempotency key goes", lookupKeyPlaceholder)
		}
	}

	// Status lists. An explicit list wins over the other list's default: a
	// code claimed explicitly is dropped from the defaulted list.
	terminal, terminalSet := DefaultTerminalStatuses(), e.TerminalStatuses != nil
	retryable, retryableSet := DefaultRetryableStatuses(), e.RetryableStatuses != nil
	if terminalSet {
		terminal = sortedUnique(*e.TerminalStatuses)
	}
	if retryableSet {
		retryable = sortedUnique(*e.RetryableStatuses)
	}
	switch {
	case terminalSet && !retryableSet:
		retryable = slices.DeleteFunc(retryable, func(c int) bool { return slices.Contains(terminal, c) })
	case retryableSet && !terminalSet:
		terminal = slices.DeleteFunc(terminal, func(c int) bool { return slices.Contains(retryable, c) })
	}
	checkStatuses(errs, "effect.terminal_statuses", terminal)
	checkStatuses(errs, "effect.retryable_statuses", retryable)
	for _, c := range terminal {
		if slices.Contains(retryable, c) {
			errs.add("effect.retryable_statuses", "%d is also in terminal_statuses; a status is either terminal or retryable", c)
		}
	}
	if terminal == nil {
		terminal = []int{}
	}
	if retryable == nil {
		retryable = []int{}
	}
	out.TerminalStatuses, out.RetryableStatuses = terminal, retryable
	r.Effect = out
}

func checkStatuses(errs *routeErrs, field string, codes []int) {
	for _, c := range codes {
		switch {
		case c < minStatus || c > maxStatus:
			errs.add(field, "%d is not an HTTP status (%d to %d)", c, minStatus, maxStatus)
		case c >= successLow && c <= successTop:
			errs.add(field, "%d is a success; every 2xx already counts as the effect's evidence", c)
		}
	}
}

func buildRetention(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	retention, retentionSet := errs.duration("retention", spec.Retention)
	horizon, horizonSet := errs.duration("broker_retention", spec.BrokerRetention)
	switch r.Broker {
	case gate.BrokerPubSub:
		if !horizonSet {
			horizon = DefaultPubSubBrokerRetention
		} else if horizon < MinPubSubRetention || horizon > MaxPubSubRetention {
			errs.add("broker_retention", "%s is outside Pub/Sub's message retention range of %s to %s", horizon, MinPubSubRetention, MaxPubSubRetention)
		}
		if !retentionSet && spec.Retention == "" {
			retention = horizon + pubSubRetentionMargin
		}
	case gate.BrokerSNS:
		if spec.BrokerRetention != "" {
			errs.add("broker_retention", "only applies to pubsub; SNS delivers for at most %s after the first attempt, whatever its delivery policy", SNSRedeliveryHorizon)
		}
		horizon = SNSRedeliveryHorizon
		if !retentionSet && spec.Retention == "" {
			retention = DefaultSNSRetention
		}
	default:
		return
	}
	r.Retention = retention
	if (retentionSet || spec.Retention == "") && retention < horizon {
		errs.add("retention", "%s does not cover the broker's redelivery horizon (%s): a late redelivery would look like a new message", retention, horizon)
	}
}

// checkHTTPURL accepts an absolute http or https URL with a host.
func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return fmt.Errorf("%q must be an absolute http(s) URL", raw)
	}
	if u.User != nil {
		return fmt.Errorf("%q must not carry credentials; use effect.headers", u.Redacted())
	}
	if u.Fragment != "" {
		return fmt.Errorf("%q must not have a #fragment", raw)
	}
	return nil
}

func sortedUnique[T interface{ ~int | ~string }](in []T) []T {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}
