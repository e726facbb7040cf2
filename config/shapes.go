package config

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/ackgate/ackgate/gate"
)

// commitBoundary names, in the contract, what must be durable before the
// broker is acked.
func commitBoundary(s gate.Shape) string {
	switch s {
	case gate.ShapeHandoff:
		return "the operation and its outbox entry, in one transaction; the effect's evidence follows from the relay"
	case gate.ShapeLocal:
		return "the statement's effect and its evidence, in one transaction"
	case "":
		return ""
	}
	return "the downstream's evidence of the effect"
}

var (
	// placeholderRE finds the statement's parameters ($1, $2, ...).
	placeholderRE = regexp.MustCompile(`\$([0-9]+)`)
	// roleRE is a plain SQL identifier: what SET ROLE gets, quoted.
	roleRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)
)

// buildLocal reads a local route's statement. Its parameters must match
// the statement's placeholders one for one, so a message can never be
// bound to the wrong one or spliced into the text.
func buildLocal(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	if spec.Effect != nil {
		errs.add("effect", "shape local has no downstream call: its effect is local.sql")
	}
	if spec.Local == nil {
		errs.add("local", "required for shape local: the statement that is the route's effect")
		return
	}
	ls := spec.Local
	out := &gate.LocalSpec{SQL: strings.TrimSpace(ls.SQL), Role: ls.Role, Timeout: DefaultLocalTimeout}
	if out.SQL == "" {
		errs.add("local.sql", "required")
	}
	if strings.Contains(out.SQL, "\x00") {
		errs.add("local.sql", "contains NUL")
	}
	for i, p := range ls.Params {
		kind, name, _ := strings.Cut(p, ":")
		lp := gate.LocalParam{Kind: gate.LocalParamKind(kind), Name: name}
		switch lp.Kind {
		case gate.ParamDataJSON, gate.ParamDataBytes, gate.ParamIdempotencyKey, gate.ParamOperationID, gate.ParamMessageID:
			if name != "" {
				errs.add("local.params", "$%d: %s takes no name", i+1, kind)
			}
		case gate.ParamAttribute:
			if strings.TrimSpace(name) == "" {
				errs.add("local.params", "$%d: attribute needs a name, as attribute:NAME", i+1)
			}
		default:
			errs.add("local.params", "$%d: %q is not data_json, data_bytes, idempotency_key, operation_id, message_id or attribute:NAME", i+1, p)
		}
		out.Params = append(out.Params, lp)
	}
	highest := 0
	for _, m := range placeholderRE.FindAllStringSubmatch(out.SQL, -1) {
		if n, err := strconv.Atoi(m[1]); err == nil && n > highest {
			highest = n
		}
	}
	if out.SQL != "" && highest != len(out.Params) {
		errs.add("local.params", "the statement uses $1 to $%d, and %d parameters are listed", highest, len(out.Params))
	}
	if out.Role != "" && !roleRE.MatchString(out.Role) {
		errs.add("local.role", "%q is not a plain SQL role name", out.Role)
	}
	if d, ok := errs.duration("local.timeout", ls.Timeout); ok {
		out.Timeout = d
		if d <= 0 {
			errs.add("local.timeout", "must be positive, got %s", d)
		}
	}
	r.Local = out
}

// buildHandoff reads the relay's pacing of a handoff route, and what a
// handoff route may not do: keep the whole envelope (the outbox keeps the
// message without private attributes, not the request as received).
func buildHandoff(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	if r.Shape != gate.ShapeHandoff {
		if spec.Handoff != nil && r.Shape != "" {
			errs.add("handoff", "only applies to shape handoff, not %s", r.Shape)
		}
		return
	}
	h := &gate.HandoffSpec{RetryMin: DefaultHandoffRetryMin, RetryMax: DefaultHandoffRetryMax}
	if spec.Handoff != nil {
		if d, ok := errs.duration("handoff.retry_min", spec.Handoff.RetryMin); ok {
			h.RetryMin = d
		}
		if d, ok := errs.duration("handoff.retry_max", spec.Handoff.RetryMax); ok {
			h.RetryMax = d
		}
	}
	if h.RetryMin <= 0 || h.RetryMax < h.RetryMin {
		errs.add("handoff", "retry_min must be positive and retry_max at least retry_min, got %s and %s", h.RetryMin, h.RetryMax)
	}
	r.Handoff = h
	if r.Effect.BodyMode == gate.BodyEnvelope {
		errs.add("effect.body_mode", "envelope is not kept by the outbox; a handoff route sends raw or cloudevent")
	}
	if r.Effect.Timeout > MaxHandoffEffectTimeout {
		errs.add("effect.timeout", "%s is longer than a relay pass may take (%s)", r.Effect.Timeout, MaxHandoffEffectTimeout)
	}
}
