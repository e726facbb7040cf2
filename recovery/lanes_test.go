package recovery_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
)

// The lane gauges show the latest background count and nothing else: a
// scrape never queries the ledger (it still answers with the ledger's pool
// closed), the numbers match the ledger as of the refresh, and before the
// first count there are none rather than false zeros.
func TestLaneGaugesReadTheSnapshot(t *testing.T) {
	t.Parallel()
	p := newProvider(t, 0)
	c := newCluster(t, 1, routesFor(p), nil)
	r := c.replicas[0]
	ctx := context.Background()

	p.fail.Store(http.StatusServiceUnavailable)
	for _, id := range []string{"p1", "p2"} {
		if code := r.push(t, "pay", id, id); code != http.StatusServiceUnavailable {
			t.Fatalf("push %s: %d", id, code)
		}
	}
	p.fail.Store(0)
	p.drop.Store(dropAfterApply)
	if code := r.push(t, "mail", "i1", "i1"); code != http.StatusServiceUnavailable {
		t.Fatalf("push i1: %d", code)
	}
	p.drop.Store(answerAll)
	if code := r.push(t, "pay", "a1", "a1"); code != http.StatusNoContent {
		t.Fatalf("push a1: %d", code)
	}

	if _, ok := sample(r.scrape(t), "ackgate_lane_operations", nil); ok {
		t.Fatal("lane gauges before the first count")
	}
	if err := r.gw.Lanes.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	gauge := func(text, name, route, state string) float64 {
		t.Helper()
		v, ok := sample(text, name, map[string]string{"route": route, "state": state})
		if !ok {
			t.Fatalf("no %s{route=%q,state=%q} in:\n%s", name, route, state, text)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	text := r.scrape(t)
	for _, want := range []struct{ route, state string }{
		{"pay", "pending_effect"}, {"mail", "effect_indeterminate"}, {"pay", "received"}, {"mail", "terminal_failure"},
	} {
		n := c.count(t, `SELECT count(*) FROM operations WHERE route = $1 AND state = $2 AND conflict_of IS NULL`, want.route, want.state)
		if got := gauge(text, "ackgate_lane_operations", want.route, want.state); got != float64(n) {
			t.Errorf("lane %s/%s = %v, ledger has %d", want.route, want.state, got, n)
		}
	}
	if got := gauge(text, "ackgate_lane_operations", "pay", "pending_effect"); got != 2 {
		t.Errorf("pending lane of pay = %v, want 2", got)
	}
	if _, ok := sample(text, "ackgate_lane_operations", map[string]string{"state": "acknowledged"}); ok {
		t.Error("acknowledged work is counted as a lane")
	}
	if gauge(text, "ackgate_lane_oldest_age_seconds", "pay", "pending_effect") <= 0 ||
		gauge(text, "ackgate_lane_oldest_age_seconds", "mail", "effect_indeterminate") <= 0 {
		t.Errorf("oldest ages not reported:\n%s", text)
	}
	if got := gauge(text, "ackgate_lane_oldest_age_seconds", "pay", "effect_indeterminate"); got != 0 {
		t.Errorf("age of an empty lane = %v, want 0", got)
	}

	// New work shows only at the next count.
	p.fail.Store(http.StatusServiceUnavailable)
	if code := r.push(t, "pay", "p3", "p3"); code != http.StatusServiceUnavailable {
		t.Fatalf("push p3: %d", code)
	}
	if got := gauge(r.scrape(t), "ackgate_lane_operations", "pay", "pending_effect"); got != 2 {
		t.Errorf("a scrape between counts shows %v, want the counted 2", got)
	}

	// Without the ledger a scrape still answers from the snapshot; only the
	// count needs the ledger.
	r.gw.Pool.Close()
	text = r.scrape(t)
	if got := gauge(text, "ackgate_lane_operations", "pay", "pending_effect"); got != 2 {
		t.Errorf("with the pool closed the scrape shows %v, want 2", got)
	}
	if _, ok := sampleBare(text, "ackgate_lane_snapshot_age_seconds"); !ok {
		t.Errorf("no ackgate_lane_snapshot_age_seconds:\n%s", text)
	}
	if err := r.gw.Lanes.Refresh(ctx); err == nil {
		t.Error("a refresh without the ledger succeeded: it did not count in the ledger")
	}
}
