package recovery_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/testenv"
)

// waitState waits for an operation to reach state: the ack of a delivery is
// marked once its response is out, just after the client has it.
func (c *cluster) waitState(t *testing.T, route, id, state string) op {
	t.Helper()
	var o op
	testenv.Eventually(t, 30*time.Second, func() bool {
		o = c.op(t, route, id)
		return o.State == state
	}, func() string { return fmt.Sprintf("%s/%s is %s, want %s", route, id, o.State, state) })
	return o
}

// The purge removes settled operations past their retention with every row
// that hangs off them, and keeps everything else: evidence inside its
// retention, open and indeterminate work past it (counted instead), and an
// expired original whose conflict record is still retained. Two replicas
// purging at once remove each row once, and the purged operations' Redis
// keys go with them.
func TestPurgeRemovesOnlyExpiredSettledEvidence(t *testing.T) {
	t.Parallel()
	p := newProvider(t, 0)
	c := newCluster(t, 2, routesFor(p), nil)
	r := c.replicas[0]
	ctx := context.Background()

	// expired: past retention when the purge runs (old-original without
	// its conflict record); kept: still there after it.
	type want struct {
		route, id     string
		expired, kept bool
	}
	var all []want
	push := func(route, id, data string, code int, expired, kept bool) {
		t.Helper()
		if got := r.push(t, route, id, data); got != code {
			t.Fatalf("push %s: %d, want %d", id, got, code)
		}
		all = append(all, want{route, id, expired, kept})
	}

	for i := range 3 {
		push("pay", fmt.Sprintf("old-acked-%d", i), "a", http.StatusNoContent, true, false)
	}
	p.fail.Store(http.StatusBadRequest)
	push("pay", "old-terminal", "t", http.StatusServiceUnavailable, true, false)
	p.fail.Store(http.StatusServiceUnavailable)
	push("pay", "old-pending", "p", http.StatusServiceUnavailable, true, true)
	p.fail.Store(0)
	p.drop.Store(dropAfterApply)
	push("mail", "old-indeterminate", "i", http.StatusServiceUnavailable, true, true)
	p.drop.Store(answerAll)
	// An expired original with an expired conflict record: both go.
	push("pay", "old-conflicted", "one", http.StatusNoContent, true, false)
	if got := r.push(t, "pay", "old-conflicted", "two"); got != http.StatusServiceUnavailable {
		t.Fatalf("conflicting push: %d", got)
	}
	// An expired original whose conflict record is not: both stay.
	push("pay", "old-original", "one", http.StatusNoContent, false, true)
	if got := r.push(t, "pay", "old-original", "two"); got != http.StatusServiceUnavailable {
		t.Fatalf("conflicting push: %d", got)
	}
	push("pay", "new-acked", "n", http.StatusNoContent, false, true)

	states := map[string]string{}
	for _, w := range all {
		switch w.id {
		case "old-terminal":
			states[w.id] = c.waitState(t, w.route, w.id, "terminal_failure").ID
		case "old-pending":
			states[w.id] = c.waitState(t, w.route, w.id, "pending_effect").ID
		case "old-indeterminate":
			states[w.id] = c.waitState(t, w.route, w.id, "effect_indeterminate").ID
		default:
			states[w.id] = c.waitState(t, w.route, w.id, "acknowledged").ID
		}
	}
	conflicts := c.count(t, `SELECT count(*) FROM operations WHERE conflict_of IS NOT NULL`)
	if conflicts != 2 {
		t.Fatalf("%d conflict records, want 2", conflicts)
	}
	var purgedIDs, expired []string
	for _, w := range all {
		if !w.kept {
			purgedIDs = append(purgedIDs, states[w.id])
		}
		if w.expired {
			expired = append(expired, states[w.id])
		}
	}
	c.expire(t, expired, true)
	c.expire(t, []string{states["old-original"]}, false)
	var fences int
	for _, id := range purgedIDs {
		fences += int(c.rdb.Exists(ctx, "ackgate:{"+id+"}:fence").Val())
	}
	if fences != len(purgedIDs) {
		t.Fatalf("%d of %d fence counters in Redis before the purge", fences, len(purgedIDs))
	}

	// Both replicas purge at once.
	var wg sync.WaitGroup
	errs := make([]error, len(c.replicas))
	for i, rep := range c.replicas {
		wg.Go(func() { errs[i] = rep.gw.Purger.RunOnce(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("purger %d: %v", i, err)
		}
	}

	for _, w := range all {
		id := states[w.id]
		n := c.count(t, `SELECT count(*) FROM operations WHERE id = $1`, id)
		if w.kept != (n == 1) {
			t.Errorf("%s (%s): %d rows after the purge, kept should be %v", w.id, id, n, w.kept)
		}
	}
	// One conflict record (of old-conflicted) went with its original.
	if n := c.count(t, `SELECT count(*) FROM operations WHERE conflict_of IS NOT NULL`); n != 1 {
		t.Errorf("%d conflict records left, want 1", n)
	}
	for _, table := range []string{"deliveries", "attempts", "transitions", "dead_letters", "interventions", "lease_events"} {
		if n := c.count(t, `SELECT count(*) FROM `+table+` WHERE operation_id = ANY($1)`, purgedIDs); n != 0 {
			t.Errorf("%d %s rows left of purged operations", n, table)
		}
	}
	for _, id := range purgedIDs {
		if keys := c.rdb.Keys(ctx, "ackgate:{"+id+"}:*").Val(); len(keys) != 0 {
			t.Errorf("Redis keys left for purged %s: %v", id, keys)
		}
	}

	// Each row was removed once: the replicas' counts add up to the rows.
	var total float64
	for _, rep := range c.replicas {
		text := rep.scrape(t)
		v, _ := sample(text, "ackgate_purge_operations_total", map[string]string{"route": "pay"})
		n, _ := strconv.ParseFloat(v, 64)
		total += n
		if _, ok := sample(text, "ackgate_purge_last_finished_seconds", nil); !ok {
			t.Errorf("replica without ackgate_purge_last_finished_seconds:\n%s", text)
		}
		for route, want := range map[string]string{"pay": "1", "mail": "1"} {
			if v, _ := sample(text, "ackgate_purge_kept_open", map[string]string{"route": route}); v != want {
				t.Errorf("ackgate_purge_kept_open{route=%q} = %q, want %s", route, v, want)
			}
		}
	}
	// The expired operations of pay: three acked, one terminal, one conflicted
	// original and its conflict record, each counted once.
	if total != 6 {
		t.Errorf("purged operations counted %v, want 6", total)
	}

	// A redelivery of a purged message is a new operation; one that is kept
	// is answered from its record.
	if got := r.push(t, "pay", "old-pending", "p"); got != http.StatusNoContent {
		t.Errorf("redelivery of the kept pending operation: %d", got)
	}
	if n := c.count(t, `SELECT count(*) FROM operations WHERE id = $1`, states["old-pending"]); n != 1 {
		t.Error("the kept operation was replaced")
	}
}

// Poison records go after their route's retention, and those of routes no
// longer configured after the longest one.
func TestPurgeRemovesOldPoisonRecords(t *testing.T) {
	t.Parallel()
	p := newProvider(t, 0)
	c := newCluster(t, 1, routesFor(p), nil)
	ctx := context.Background()
	now := time.Now()
	for _, row := range []struct {
		route, fp string
		age       time.Duration
	}{
		{"pay", "old", 9 * 24 * time.Hour}, {"pay", "new", time.Hour},
		{"gone", "old", 9 * 24 * time.Hour}, {"gone", "new", 7 * 24 * time.Hour},
	} {
		if _, err := c.pool.Exec(ctx, `INSERT INTO poison_messages (route, fingerprint, broker, reason, first_seen, last_seen, acked)
			VALUES ($1, $2, 'pubsub', 'no identity', $3, $3, false)`, row.route, row.fp, now.Add(-row.age)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.replicas[0].gw.Purger.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := c.pool.Query(ctx, `SELECT route || '/' || fingerprint FROM poison_messages ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		left = append(left, s)
	}
	if !slices.Equal(left, []string{"gone/new", "pay/new"}) {
		t.Errorf("poison records left: %v", left)
	}
}
