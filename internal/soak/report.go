package soak

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Print writes the report: what ran, what was injected, where every message
// ended up, and the four invariants last, each of which must be 0.
func (r *Report) Print(w io.Writer) {
	c := r.Config
	line := func(label string, format string, args ...any) {
		fmt.Fprintf(w, "  %-36s %s\n", label, fmt.Sprintf(format, args...))
	}
	names := make([]string, len(routes))
	for i, rt := range routes {
		names[i] = strings.TrimPrefix(rt.name, "soak-")
	}
	fmt.Fprintf(w, "ackgate soak: %d messages (+%d reusing a key with a changed payload), routes %s, 2 gateways, broker %s, seed %d\n",
		r.Messages, r.Reused, strings.Join(names, "/"), c.Broker, c.Seed)
	fmt.Fprintf(w, "duration %s (publication %s at %.0f messages/s)\n", r.Total.Round(time.Second), r.Publish.Round(time.Second), c.Rate)

	fmt.Fprintln(w, "faults")
	line("gateway SIGKILL + restart", "%d (gateway 1: %d, gateway 2: %d)", r.Kills[0]+r.Kills[1], r.Kills[0], r.Kills[1])
	line("Redis restarts, data lost", "%d", r.RedisRestarts)
	line("Postgres crash + restart", "%d", r.PostgresRestarts)
	var d struct{ fail, lost, slow, poison, lookups, lookupsDown int }
	for _, rec := range r.Downstream {
		d.fail += rec.Counts.Injected5xx
		d.lost += rec.Counts.LostResponses
		d.slow += rec.Counts.SlowResponses
		d.poison += rec.Counts.PoisonRefusals
		d.lookups += rec.Counts.Lookups
		d.lookupsDown += rec.Counts.LookupsDown
	}
	line("downstream 5xx, nothing applied", "%d", d.fail)
	line("responses lost after applying", "%d", d.lost)
	line("responses slower than the deadline", "%d (held %s)", d.slow, AckDeadline+time.Second)
	line("poisoned messages", "%d terminal, %d retryable (%d refusals)", r.Poisoned["terminal"], r.Poisoned["retryable"], d.poison)
	line("lookups unavailable", "%d of %d", d.lookupsDown, d.lookups)
	if c.Broker == BrokerEmulator {
		line("published twice by the publisher", "%d", r.Republished)
	} else {
		line("duplicate copies pushed at once", "%d", r.Broker.Duplicates)
	}
	line("redeliveries after an ack", "%d", r.Broker.RedeliveriesAfter)

	if c.Broker == BrokerEmulator {
		policy := "none: every route dead-letters at the gateway"
		if c.EmulatorDeadLetter {
			policy = fmt.Sprintf("dead-letter topic after %d deliveries", c.MaxDeliveryAttempts)
		}
		fmt.Fprintf(w, "broker (Pub/Sub emulator; subscription policy: %s)\n", policy)
	} else {
		fmt.Fprintln(w, "broker (push simulator)")
	}
	line("push requests", "%d", r.Broker.Deliveries)
	line("answers", "%s", statuses(r.Broker.Statuses))
	line("timeouts / broken connections", "%d / %d", r.Broker.Timeouts, r.Broker.ConnectionErrors)
	line("messages acked", "%d", r.Broker.Acked)
	line("dead-lettered by the subscription", "%d", r.Broker.DeadLettered)
	if r.Broker.Abandoned > 0 {
		line("abandoned when the run ended", "%d", r.Broker.Abandoned)
	}
	if c.Broker == BrokerEmulator {
		line("pushes carrying deliveryAttempt", "%d", r.PushesWithAttempt)
		line("held by the emulator at the end", "%d", r.Held)
	}

	fmt.Fprintln(w, "downstream (its own records)")
	for _, rec := range r.Downstream {
		extra := ""
		if rec.Endpoint.Dedupe {
			extra = fmt.Sprintf(", %d replayed by key", rec.Counts.Replayed)
		}
		if rec.Endpoint.Lookup {
			extra += fmt.Sprintf(", %d lookups", rec.Counts.Lookups)
		}
		line(rec.Endpoint.Name, "%d calls, %d effects applied%s", rec.Counts.Calls, rec.Counts.Applied, extra)
	}

	v := r.Verdict
	fmt.Fprintln(w, "accounting (each published payload once)")
	line("acked with evidence", "%d", v.AckedWithEvidence)
	line("dead-lettered with a reason, acked", "%d", v.DeadLettered)
	line("lane: indeterminate", "%d", v.Indeterminate)
	line("lane: terminal", "%d", v.Terminal)
	line("lane: conflicting", "%d", v.Conflicting)
	line("lane: pending", "%d", v.Pending)
	line("confirmed, ack never reached broker", "%d", v.ConfirmedUnacked)
	line("acked, delivery unrecorded (twin's)", "%d", v.AckedUnrecorded)
	line("ledger records without a message", "%d", v.Orphans)
	fmt.Fprintln(w, "handoff (acked at the handoff; then the relay)")
	line("confirmed by the downstream", "%d", v.HandedOffConfirmed)
	line("parked: indeterminate", "%d", v.HandedOffParked)
	line("terminal, dead-lettered", "%d", v.HandedOffTerminal)
	line("still open after the drain", "%d", v.HandedOffOpen)
	line("outbox entries not emptied", "%d (parked %d, terminal %d, confirmed awaiting the sweep %d, open %d)",
		v.OutboxParked+v.OutboxTerminal+v.OutboxConfirmed+v.OutboxOpen, v.OutboxParked, v.OutboxTerminal, v.OutboxConfirmed, v.OutboxOpen)
	fmt.Fprintln(w, "local (statement in the ledger's transaction)")
	line("acked, one row committed with it", "%d (of the acked with evidence)", v.LocalCommitted)
	line("rows in the local table", "%d", v.LocalRows)
	o := r.Operator
	fmt.Fprintf(w, "lanes (who settled what the gateway parked; operator every %s)\n", c.OperatorEvery)
	line("settled by the reconciler's lookup", "%d", v.SettledByReconciler)
	line("operator: happened / not_happened", "%d / %d", v.ResolvedHappened, v.ResolvedNotHappened)
	line("operator: abandoned", "%d", v.ResolvedAbandoned)
	line("operator: replayed", "%d (then confirmed %d, terminal again %d; %d payloads cured first)",
		v.Replayed, v.ReplayedConfirmed, v.ReplayedTerminal, o.Cured)
	line("operator: published again", "%d (refused %d, rounds %d, failed rounds %d)", o.Republished, o.Refused, o.Rounds, o.Errors)
	line("handoff found by lookup", "%d", v.HandoffByLookup)
	line("handoff lost answer, same-key retry", "%d", v.HandoffByDedupe)

	if len(r.Events) > 0 {
		fmt.Fprintln(w, "events (what each cost, until the next one or the end, at most 2m)")
		for _, e := range r.Events {
			took := e.End.Sub(e.Start).Round(time.Millisecond)
			status := "done"
			if e.Err != "" {
				status = "FAILED: " + e.Err
			}
			fmt.Fprintf(w, "  %s (at +%s, took %s, %s)\n", e.Name, e.Start.Sub(r.Started).Round(time.Second), took, status)
			nacks := "none"
			if e.Nacked > 0 {
				nacks = fmt.Sprintf("%d, from +%s to +%s after it began (%s)", e.Nacked,
					e.FirstNack.Round(10*time.Millisecond), e.LastNack.Round(10*time.Millisecond), statuses(e.NackedStatuses))
			}
			line("    deliveries not acked", "%s", nacks)
			line("    acked again from", "+%s (%d nacked until then, %d later)", e.Recovered.Round(10*time.Millisecond),
				e.NackedBefore, e.Nacked-e.NackedBefore)
			line("    deliveries acked", "%d in %s", e.Acked, e.Window.Round(time.Second))
			for g, d := range e.Unready {
				line(fmt.Sprintf("    gateway %d /readyz not 200", g+1), "%s", d.Round(10*time.Millisecond))
			}
		}
	}
	fmt.Fprintln(w, "invariants (each must be 0)")
	for _, inv := range v.Invariants() {
		line(inv.Name, "%d", inv.Count)
		for _, ex := range inv.Examples {
			fmt.Fprintf(w, "      e.g. %s\n", ex)
		}
	}
	if n := v.Violations(); n > 0 {
		fmt.Fprintf(w, "FAIL: %d violation(s)", n)
		if r.KeptDir != "" {
			fmt.Fprintf(w, "; routes and logs kept in %s", r.KeptDir)
		}
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintln(w, "PASS")
}

func statuses(m map[int]int) string {
	codes := make([]int, 0, len(m))
	for c := range m {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d: %d", c, m[c])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
