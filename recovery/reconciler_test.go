package recovery_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ackgate/ackgate/internal/testenv"
)

// Each answer of the lookup does what the decision table says, and only to
// the lookup route's operations: found confirms and the next delivery acks
// without a new effect; absent grants one attempt that the next delivery
// makes with the same key; unavailable leaves the operation in the lane
// with its next check visible and further away each time; an unsafe
// route's operation is never looked up. Every lookup the reconciler made is
// an attempt of kind lookup in the record.
func TestReconcilerSettlesTheLookupLane(t *testing.T) {
	t.Parallel()
	p := newProvider(t, 0)
	c := newCluster(t, 1, routesFor(p), nil)
	r := c.replicas[0]
	ctx := context.Background()

	// Lost responses while the lookup is down: every one indeterminate.
	p.drop.Store(dropAfterApply)
	for _, m := range []struct{ route, id string }{{"pay", "m-found"}, {"pay", "m-stuck"}, {"mail", "m-unsafe"}} {
		if code := r.push(t, m.route, m.id, m.id); code != http.StatusServiceUnavailable {
			t.Fatalf("push %s: %d, want 503", m.id, code)
		}
	}
	p.drop.Store(dropBeforeApply)
	if code := r.push(t, "pay", "m-absent", "m-absent"); code != http.StatusServiceUnavailable {
		t.Fatalf("push m-absent: %d", code)
	}
	p.drop.Store(answerAll)
	found, absent, stuck, unsafe := c.op(t, "pay", "m-found"), c.op(t, "pay", "m-absent"), c.op(t, "pay", "m-stuck"), c.op(t, "mail", "m-unsafe")
	for _, o := range []op{found, absent, stuck, unsafe} {
		if o.State != "effect_indeterminate" {
			t.Fatalf("%s is %s, want effect_indeterminate", o.ID, o.State)
		}
	}
	p.stuck.Store(stuck.Key, true)

	// While the lookup is down, each check is recorded and the next one
	// waits twice as long: 1s, then 2s.
	tick := func() {
		if err := r.gw.Reconciler.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []struct {
		checks int
		wait   time.Duration
	}{{1, time.Second}, {2, 2 * time.Second}} {
		testenv.Eventually(t, 30*time.Second, func() bool {
			tick()
			return c.op(t, "pay", "m-stuck").Checks >= want.checks
		}, func() string { return fmt.Sprintf("m-stuck never reached check %d", want.checks) })
		o := c.op(t, "pay", "m-stuck")
		if o.State != "effect_indeterminate" || o.Checks != want.checks || o.NextCheck == nil ||
			o.NextCheck.Sub(o.Updated) != want.wait {
			t.Fatalf("after check %d: %+v (next check %v after the change), want the next check %s later",
				want.checks, o, o.NextCheck, want.wait)
		}
	}

	p.lookupUp.Store(true)
	testenv.Eventually(t, 30*time.Second, func() bool {
		tick()
		return c.op(t, "pay", "m-found").State == "effect_confirmed" && c.op(t, "pay", "m-absent").State == "pending_effect"
	}, func() string {
		return fmt.Sprintf("found %+v, absent %+v", c.op(t, "pay", "m-found"), c.op(t, "pay", "m-absent"))
	})

	// Every lookup, the delivery's own first one and the reconciler's, is
	// in the record as an attempt of kind lookup.
	for _, o := range []op{found, absent, stuck} {
		_, lookups := p.counts(o.Key)
		var recorded int
		for _, a := range c.attempts(t, o.ID) {
			if strings.HasPrefix(a, "lookup:") {
				recorded++
				if !strings.HasSuffix(a, ":"+o.Key) {
					t.Errorf("%s: lookup attempt %s under another key", o.ID, a)
				}
			}
		}
		if recorded == 0 || recorded != lookups {
			t.Errorf("%s: %d lookups at the provider, %d recorded", o.ID, lookups, recorded)
		}
	}
	if got := c.attempts(t, found.ID); !slices.Contains(got, "lookup:confirmed:"+found.Key) {
		t.Errorf("found: attempts %v lack the confirming lookup", got)
	}
	if o := c.op(t, "pay", "m-absent"); o.Grant != o.Attempts+1 || o.NextCheck != nil || o.Checks != 0 {
		t.Errorf("absent: %+v, want one attempt granted and no check scheduled", o)
	}
	if o := c.op(t, "pay", "m-stuck"); o.State != "effect_indeterminate" || o.NextCheck == nil {
		t.Errorf("stuck: %+v, want it still indeterminate with its next check", o)
	}
	if calls, lookups := p.counts(unsafe.Key); lookups != 0 || calls != 1 {
		t.Errorf("unsafe: %d calls, %d lookups; want 1 and 0", calls, lookups)
	}
	if o := c.op(t, "mail", "m-unsafe"); o.State != "effect_indeterminate" || o.Attempts != unsafe.Attempts || o.Fence != unsafe.Fence {
		t.Errorf("unsafe operation touched: %+v, was %+v", o, unsafe)
	}

	// The next deliveries: found acks without a new effect; absent makes
	// exactly one more attempt, under the same key, and acks.
	if code := r.push(t, "pay", "m-found", "m-found"); code != http.StatusNoContent {
		t.Errorf("redelivery of found: %d, want 204", code)
	}
	if calls, _ := p.counts(found.Key); calls != 1 {
		t.Errorf("found: %d effect calls, want still 1", calls)
	}
	before := c.attempts(t, absent.ID)
	if code := r.push(t, "pay", "m-absent", "m-absent"); code != http.StatusNoContent {
		t.Errorf("redelivery of absent: %d, want 204", code)
	}
	after := c.attempts(t, absent.ID)
	if len(after) != len(before)+1 || after[len(after)-1] != "effect:confirmed:"+absent.Key {
		t.Errorf("absent: attempts %v after %v, want exactly one more effect under %s", after, before, absent.Key)
	}
	if calls, _ := p.counts(absent.Key); calls != 2 {
		t.Errorf("absent: %d effect calls, want the lost one and the granted one", calls)
	}

	text := r.scrape(t)
	for outcome, min := range map[string]float64{"found": 1, "absent": 1, "unavailable": 2} {
		v, ok := sample(text, "ackgate_reconcile_operations_total", map[string]string{"route": "pay", "outcome": outcome})
		var got float64
		fmt.Sscan(v, &got)
		if !ok || got < min {
			t.Errorf("ackgate_reconcile_operations_total{outcome=%q} = %q, want at least %v", outcome, v, min)
		}
	}
	if _, ok := sample(text, "ackgate_reconcile_operations_total", map[string]string{"route": "mail"}); ok {
		t.Error("the unsafe route has reconcile metrics")
	}
}
