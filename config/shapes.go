package config

import (
	"fmt"
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
	} else if why := sessionChange(out.SQL); why != "" {
		errs.add("local.sql", "%s", why)
	}
	for i, p := range ls.Params {
		kind, name, _ := strings.Cut(p, ":")
		// attribute?:NAME is an attribute the message may leave out: NULL
		// is bound for it. A plain attribute:NAME must be there.
		kind, optional := strings.CutSuffix(kind, "?")
		lp := gate.LocalParam{Kind: gate.LocalParamKind(kind), Name: name, Optional: optional}
		switch lp.Kind {
		case gate.ParamDataJSON, gate.ParamDataBytes, gate.ParamIdempotencyKey, gate.ParamOperationID, gate.ParamMessageID:
			switch {
			case optional:
				errs.add("local.params", "$%d: %s is always there; only an attribute can be optional", i+1, kind)
			case name != "":
				errs.add("local.params", "$%d: %s takes no name", i+1, kind)
			}
		case gate.ParamAttribute:
			if strings.TrimSpace(name) == "" {
				errs.add("local.params", "$%d: attribute needs a name, as attribute:NAME (or attribute?:NAME when it may be absent)", i+1)
			}
		default:
			errs.add("local.params", "$%d: %q is not data_json, data_bytes, idempotency_key, operation_id, message_id, attribute:NAME or attribute?:NAME", i+1, p)
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

// statementKinds are the statements a local route may run: those that return
// the result id and that EXPLAIN can plan, which the start-up check needs.
var statementKinds = map[string]bool{
	"select": true, "insert": true, "update": true, "delete": true, "merge": true, "with": true, "values": true, "table": true,
}

// sessionChangeRE finds, in a statement with its literals and comments
// taken out, a call that changes a setting of the session or transaction,
// the role among them.
var sessionChangeRE = regexp.MustCompile(`(?i)\bset_config\s*\(`)

// sessionChange says why sql may not be a local route's statement, or ""
// when it may. The statement runs in the ledger's own transaction under
// SET LOCAL ROLE: one that changed the role back (SET ROLE, RESET,
// set_config('role', ...)), the session (SET SESSION AUTHORIZATION,
// DISCARD) or the transaction (COMMIT, ROLLBACK, SAVEPOINT) would undo the
// role or the evidence around it. This reads the text only; what a
// function the statement calls does inside is not seen (see
// docs/operations.md, local routes).
func sessionChange(sql string) string {
	code := sqlCode(sql)
	first := strings.ToLower(strings.TrimLeft(strings.Fields(code + " x")[0], "("))
	if !statementKinds[first] {
		return fmt.Sprintf("must be one SELECT, INSERT, UPDATE, DELETE or MERGE statement (WITH allowed), not %s: the statement runs inside the ledger's transaction, under its role, and may not change either", strings.ToUpper(gate.Bound(first, 32)))
	}
	if sessionChangeRE.MatchString(strings.ReplaceAll(code, `"`, "")) {
		return "calls set_config, which can change the role or a setting of the ledger's transaction; it is refused"
	}
	return ""
}

// sqlCode is sql with its comments and string literals blanked out, so
// that only code is searched: 'set_config(' inside a literal is data.
func sqlCode(sql string) string {
	var b strings.Builder
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case strings.HasPrefix(sql[i:], "--"):
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				end = len(sql) - i
			}
			i += end
			b.WriteByte(' ')
		case strings.HasPrefix(sql[i:], "/*"):
			depth, j := 0, i
			for j < len(sql) {
				if strings.HasPrefix(sql[j:], "/*") {
					depth++
					j += 2
				} else if strings.HasPrefix(sql[j:], "*/") {
					depth--
					j += 2
					if depth == 0 {
						break
					}
				} else {
					j++
				}
			}
			i = j
			b.WriteByte(' ')
		case c == '\'':
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e')
			j := i + 1
			for j < len(sql) {
				if escapes && sql[j] == '\\' {
					j += 2
					continue
				}
				if sql[j] == '\'' {
					if j+1 < len(sql) && sql[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			i = j + 1
			b.WriteString("''")
		case c == '$':
			if m := dollarTagRE.FindString(sql[i:]); m != "" {
				end := strings.Index(sql[i+len(m):], m)
				if end < 0 {
					i = len(sql)
				} else {
					i += len(m) + end + len(m)
				}
				b.WriteString("''")
				continue
			}
			b.WriteByte(c)
			i++
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// dollarTagRE is the opening of a dollar-quoted string: $$ or $tag$.
var dollarTagRE = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)?\$`)
