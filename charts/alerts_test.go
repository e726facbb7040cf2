package charts

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	plabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ackgate/ackgate/internal/testenv"
)

// PrometheusRule is the part of monitoring.coreos.com/v1 PrometheusRule the
// chart writes, decoded as strictly as the Kubernetes types.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PrometheusRuleSpec `json:"spec"`
}

type PrometheusRuleSpec struct {
	Groups []RuleGroup `json:"groups"`
}

type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// docAlert is one row of docs/operations.md's alert table.
type docAlert struct{ name, expr, forDur, severity string }

var alertRow = regexp.MustCompile("^\\| `(Ackgate\\w+)` \\| `(.*?)` \\|\\s*(.*?)\\s*\\| (\\w+) \\|")

func docAlerts(t *testing.T) []docAlert {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Alerts\n")
	if start < 0 {
		t.Fatal(`docs/operations.md has no "## Alerts" section`)
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var out []docAlert
	for _, line := range strings.Split(section, "\n") {
		if m := alertRow.FindStringSubmatch(line); m != nil {
			out = append(out, docAlert{m[1], strings.ReplaceAll(m[2], `\|`, "|"), m[3], m[4]})
		} else if strings.HasPrefix(line, "| `Ackgate") {
			t.Fatalf("an alert row of docs/operations.md does not parse: %s", line)
		}
	}
	if len(out) < 10 {
		t.Fatalf("docs/operations.md lists only %d alerts", len(out))
	}
	return out
}

func ruleAlerts(t *testing.T, overrides ...string) []Rule {
	t.Helper()
	r := mustRender(t, withExampleRoutes(t, append([]string{"prometheusRule: {enabled: true, alertLabels: {team: payments}}"}, overrides...)...))
	rules := all[PrometheusRule](r)
	if len(rules) != 1 || len(rules[0].Spec.Groups) != 1 {
		t.Fatalf("want one PrometheusRule with one group, got %d", len(rules))
	}
	return rules[0].Spec.Groups[0].Rules
}

func normalized(t *testing.T, expr string) string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("%s does not parse: %v", expr, err)
	}
	return e.String()
}

// The chart's PrometheusRule is off by default and, on, carries exactly
// the alerts of docs/operations.md: the same names, expressions (compared
// as parsed PromQL), durations and severities.
func TestPrometheusRuleIsTheDocumentedAlerts(t *testing.T) {
	t.Parallel()
	if slices.ContainsFunc(mustRender(t, withExampleRoutes(t)).kinds(), func(k string) bool { return strings.HasPrefix(k, "PrometheusRule/") }) {
		t.Error("a PrometheusRule is rendered by default")
	}
	docs := docAlerts(t)
	rules := ruleAlerts(t)
	if len(rules) != len(docs) {
		t.Errorf("the rule has %d alerts, docs/operations.md %d", len(rules), len(docs))
	}
	byName := map[string]Rule{}
	for _, r := range rules {
		byName[r.Alert] = r
		if r.Labels["team"] != "payments" || r.Annotations["summary"] == "" || !strings.HasSuffix(r.Annotations["runbook_url"], "docs/operations.md#alerts") {
			t.Errorf("%s: labels %v, annotations %v", r.Alert, r.Labels, r.Annotations)
		}
	}
	for _, d := range docs {
		r, ok := byName[d.name]
		switch {
		case !ok:
			t.Errorf("%s is documented but not in the rule", d.name)
		case normalized(t, r.Expr) != normalized(t, d.expr):
			t.Errorf("%s:\n rule %s\n docs %s", d.name, r.Expr, d.expr)
		case r.For != d.forDur || r.Labels["severity"] != d.severity:
			t.Errorf("%s: for %q severity %q, docs say %q and %q", d.name, r.For, r.Labels["severity"], d.forDur, d.severity)
		}
	}
	// The threshold of the slow-downstream alert is a value.
	for _, r := range ruleAlerts(t, "prometheusRule: {enabled: true, slowDownstreamSeconds: 2.5}") {
		if r.Alert == "AckgateSlowDownstream" && !strings.HasSuffix(r.Expr, "> 2.5") {
			t.Errorf("slowDownstreamSeconds 2.5: %s", r.Expr)
		}
	}
}

// sample is one scraped value at a time.
type sample struct {
	t int64
	f float64
}

func (s sample) T() int64                      { return s.t }
func (s sample) ST() int64                     { return 0 }
func (s sample) F() float64                    { return s.f }
func (s sample) H() *histogram.Histogram       { return nil }
func (s sample) FH() *histogram.FloatHistogram { return nil }
func (s sample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s sample) Copy() chunks.Sample           { return s }

// scraped holds the series of successive scrapes, as a Prometheus server
// would have stored them.
type scraped map[string]*scrapedSeries

type scrapedSeries struct {
	labels  plabels.Labels
	samples []chunks.Sample
}

func (s scraped) add(t int64, name string, ls map[string]string, v float64) {
	b := plabels.NewBuilder(plabels.EmptyLabels())
	b.Set(model.MetricNameLabel, name)
	for k, val := range ls {
		b.Set(k, val)
	}
	l := b.Labels()
	key := l.String()
	if s[key] == nil {
		s[key] = &scrapedSeries{labels: l}
	}
	s[key].samples = append(s[key].samples, sample{t, v})
}

// addScrape flattens the exposition's families the way Prometheus stores a
// classic scrape: a histogram is its _bucket (with le), _sum and _count
// series, a summary its quantiles, _sum and _count.
func (s scraped) addScrape(t int64, fams map[string]*dto.MetricFamily) {
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			with := func(k, v string) map[string]string {
				c := map[string]string{k: v}
				for a, b := range ls {
					c[a] = b
				}
				return c
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				s.add(t, name, ls, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				s.add(t, name, ls, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				s.add(t, name, ls, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					s.add(t, name+"_bucket", with("le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)), float64(b.GetCumulativeCount()))
				}
				if !slices.ContainsFunc(h.GetBucket(), func(b *dto.Bucket) bool { return math.IsInf(b.GetUpperBound(), 1) }) {
					s.add(t, name+"_bucket", with("le", "+Inf"), float64(h.GetSampleCount()))
				}
				s.add(t, name+"_sum", ls, h.GetSampleSum())
				s.add(t, name+"_count", ls, float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					s.add(t, name, with("quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), q.GetValue())
				}
				s.add(t, name+"_sum", ls, sm.GetSampleSum())
				s.add(t, name+"_count", ls, float64(sm.GetSampleCount()))
			}
		}
	}
}

// Querier implements storage.Queryable over the scrapes.
func (s scraped) Querier(_, _ int64) (storage.Querier, error) { return querier{s}, nil }

type querier struct{ s scraped }

func (q querier) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*plabels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, key := range slices.Sorted(func(yield func(string) bool) {
		for k := range q.s {
			if !yield(k) {
				return
			}
		}
	}) {
		ser := q.s[key]
		if slices.ContainsFunc(ms, func(m *plabels.Matcher) bool { return !m.Matches(ser.labels.Get(m.Name)) }) {
			continue
		}
		out = append(out, storage.NewListSeries(ser.labels, ser.samples))
	}
	return &seriesSet{list: out, i: -1}
}

func (querier) LabelValues(context.Context, string, *storage.LabelHints, ...*plabels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (querier) LabelNames(context.Context, *storage.LabelHints, ...*plabels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (querier) Close() error { return nil }

type seriesSet struct {
	list []storage.Series
	i    int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i < len(s.list) }
func (s *seriesSet) At() storage.Series                { return s.list[s.i] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

// alertChecker evaluates alert expressions with the Prometheus query engine
// over scrapes, at the time of the last one.
type alertChecker struct {
	engine *promql.Engine
	store  scraped
	at     time.Time
}

func (c alertChecker) query(expr string) (promql.Vector, error) {
	q, err := c.engine.NewInstantQuery(context.Background(), c.store, nil, expr, c.at)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, res.Err
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v, nil
	case promql.Scalar:
		return promql.Vector{{F: v.V}}, nil
	}
	return nil, fmt.Errorf("result of type %s", res.Value.Type())
}

// check evaluates expr, then every selector in it alone: each must select
// at least one series from the scrapes, so a metric or label name that the
// gateway does not export (a typo, a renamed metric) fails here instead of
// making an alert that can never fire.
func (c alertChecker) check(expr string) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	if _, err := c.query(expr); err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	var errs []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		sel := &parser.VectorSelector{Name: vs.Name, LabelMatchers: vs.LabelMatchers}
		v, err := c.query(sel.String())
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("%s: %v", sel, err))
		case len(v) == 0:
			errs = append(errs, fmt.Sprintf("%s selects no series of the gateway's /metrics", sel))
		}
		return nil
	})
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// Every alert of the PrometheusRule, evaluated with the Prometheus query
// engine against two scrapes of a real gateway process (with an
// idempotent, a lookup and a handoff route, after a delivery and once its
// background counts have run): each expression evaluates, and each of its
// selectors matches series the gateway really exports. A misspelt metric
// or label value fails, which the test proves on a broken copy.
func TestAlertsSelectRealSeries(t *testing.T) {
	t.Parallel()
	rules := ruleAlerts(t)
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/gateway").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Result-Id", "r-1")
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(down.Close)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	var yaml strings.Builder
	yaml.WriteString("routes:\n")
	for _, r := range []struct{ name, shape, extra string }{
		{"orders", "idempotent", "    dedupe_window: 1h\n"},
		{"payments", "lookup", "      lookup_url: " + down.URL + "/{key}\n"},
		{"handoff", "handoff", "      lookup_url: " + down.URL + "/{key}\n"},
	} {
		fmt.Fprintf(&yaml, "  - name: %s\n    broker: pubsub\n    auth: none\n    shape: %s\n    dead_letter: gateway\n    effect:\n      url: %s/effects\n      result_id_header: X-Result-Id\n", r.name, r.shape, down.URL)
		yaml.WriteString(r.extra)
	}
	if err := os.WriteFile(routes, []byte(yaml.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ingest, admin := freeAddr(t), freeAddr(t)
	env := append(os.Environ(),
		"GATEWAY_DATABASE_URL="+testenv.DatabaseURL(t), "GATEWAY_REDIS_URL=redis://"+testenv.Redis(t)+"/0",
		"GATEWAY_ROUTES_FILE="+routes, "GATEWAY_LISTEN_ADDR="+ingest, "GATEWAY_ADMIN_ADDR="+admin,
		"GATEWAY_ADMIN_TOKEN=test-token-0123456789", "GATEWAY_LANES_REFRESH=1s", "GATEWAY_RELAY_POLL=50ms")
	mig := exec.Command(bin, "migrate")
	mig.Env = env
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	serve := exec.Command(bin, "serve")
	serve.Env = env
	logs := &testenv.SyncBuffer{}
	serve.Stderr = logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = serve.Process.Signal(os.Interrupt)
		_ = serve.Wait()
		if t.Failed() {
			t.Logf("gateway logs:\n%s", logs.String())
		}
	})
	scrape := func() map[string]*dto.MetricFamily {
		req, _ := http.NewRequest(http.MethodGet, "http://"+admin+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer test-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return nil
		}
		return fams
	}
	push := func(route, id string) int {
		body := fmt.Sprintf(`{"message":{"data":"e30=","messageId":%q},"subscription":"projects/p/subscriptions/s"}`, id)
		resp, err := http.Post("http://"+ingest+"/v1/push/pubsub/"+route, "application/json", strings.NewReader(body))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return push("orders", "m-1") == http.StatusNoContent },
		func() string { return "the gateway never acked a delivery" })
	push("handoff", "m-2")
	// The background counts (lanes, outbox, the purge's first run) report
	// nothing until they have run once.
	var first map[string]*dto.MetricFamily
	testenv.Eventually(t, 60*time.Second, func() bool {
		first = scrape()
		for _, f := range []string{"ackgate_lane_operations", "ackgate_outbox_entries", "ackgate_purge_last_finished_seconds", "ackgate_downstream_duration_seconds"} {
			if first[f] == nil {
				return false
			}
		}
		return true
	}, func() string { return "the gateway's background gauges never appeared" })
	push("orders", "m-3")
	second := scrape()
	if second == nil {
		t.Fatal("second scrape failed")
	}

	// Two scrapes a minute apart, as a Prometheus server scraping every
	// minute would have stored them; the rules are evaluated at the second.
	t0 := time.Unix(1_800_000_000, 0)
	store := scraped{}
	store.addScrape(t0.UnixMilli(), first)
	store.addScrape(t0.Add(time.Minute).UnixMilli(), second)
	c := alertChecker{
		engine: promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute}),
		store:  store, at: t0.Add(time.Minute),
	}
	for _, r := range rules {
		if err := c.check(r.Expr); err != nil {
			t.Errorf("%s: %v\n%s", r.Alert, err, r.Expr)
		}
	}
	// The checker itself: a wrong metric name, a wrong label value.
	for _, broken := range []string{
		`max by (route) (ackgate_lane_operation{state="effect_indeterminate"}) > 0`,
		`sum by (route) (increase(ackgate_relay_passes_total{outcome="parkd"}[15m])) > 0`,
		`histogram_quantile(0.99, sum by (route, le) (rate(ackgate_downstream_duration_bucket[5m]))) > 5`,
	} {
		if err := c.check(broken); err == nil {
			t.Errorf("the check passed %s", broken)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	addr := srv.Listener.Addr().String()
	srv.Close()
	return addr
}
