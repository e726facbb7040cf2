package faultydown

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func serve(t *testing.T, f Faults, b Broken) (*Server, string) {
	t.Helper()
	s := New([]Endpoint{{Name: "dedupe", Dedupe: true}, {Name: "plain", Lookup: true}}, f, b, 1)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

type answer struct {
	status int
	id     string
	err    error
}

func call(t *testing.T, c *http.Client, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return answer{status: resp.StatusCode, id: resp.Header.Get("X-Result-Id")}
}

func lookup(t *testing.T, url string) answer {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	return answer{status: resp.StatusCode, id: resp.Header.Get("X-Result-Id")}
}

func record(s *Server, name string) EndpointRecord {
	for _, r := range s.Records() {
		if r.Endpoint.Name == name {
			return r
		}
	}
	return EndpointRecord{}
}

func TestDedupeEndpointAppliesOncePerKey(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{}, NotBroken)
	first := call(t, http.DefaultClient, url+"/dedupe/effects", "k1", `{"n":1}`)
	again := call(t, http.DefaultClient, url+"/dedupe/effects", "k1", `{"n":1}`)
	changed := call(t, http.DefaultClient, url+"/dedupe/effects", "k1", `{"n":2}`)
	if first.status != 201 || first.id == "" || again.status != 200 || again.id != first.id || changed.status != 422 {
		t.Fatalf("answers %+v %+v %+v", first, again, changed)
	}
	rec := record(s, "dedupe")
	if len(rec.Applications) != 1 || rec.Counts.Replayed != 1 || len(rec.KeyReuse) != 1 || rec.KeyReuse[0] != "k1" {
		t.Fatalf("record %+v", rec)
	}
	if a := rec.Applications[0]; a.Key != "k1" || a.ResultID != first.id || a.TraceID != "0af7651916cd43dd8448eb211c80319c" || len(a.BodySHA256) != 64 {
		t.Fatalf("application %+v", a)
	}
}

func TestPlainEndpointAppliesEveryCallAndAnswersLookups(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{}, NotBroken)
	if a := lookup(t, url+"/plain/effects/k1"); a.status != 404 {
		t.Fatalf("lookup before any effect: %+v", a)
	}
	first := call(t, http.DefaultClient, url+"/plain/effects", "k1", `{"n":1}`)
	second := call(t, http.DefaultClient, url+"/plain/effects", "k1", `{"n":1}`)
	if first.status != 201 || second.status != 201 || first.id == second.id {
		t.Fatalf("answers %+v %+v", first, second)
	}
	if a := lookup(t, url+"/plain/effects/k1"); a.status != 200 || a.id != first.id {
		t.Fatalf("lookup: %+v, want the first result %s", a, first.id)
	}
	if rec := record(s, "plain"); len(rec.Applications) != 2 || rec.Counts.Lookups != 2 {
		t.Fatalf("record %+v", rec)
	}
	if a := lookup(t, url+"/dedupe/effects/k1"); a.status != 404 && a.status != 405 {
		t.Fatalf("an endpoint without lookup answered %+v", a)
	}
}

func TestPoisonedBodiesAreRefusedEveryTime(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{}, NotBroken)
	for range 2 {
		if a := call(t, http.DefaultClient, url+"/plain/effects", "k1", `{"poison":"terminal"}`); a.status != 422 {
			t.Fatalf("terminal poison: %+v", a)
		}
		if a := call(t, http.DefaultClient, url+"/plain/effects", "k2", `{"poison":"retryable"}`); a.status != 503 {
			t.Fatalf("retryable poison: %+v", a)
		}
	}
	if rec := record(s, "plain"); len(rec.Applications) != 0 || rec.Counts.PoisonRefusals != 4 {
		t.Fatalf("record %+v", rec)
	}
}

func TestInjected5xxAppliesNothing(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{Status5xx: 1}, NotBroken)
	if a := call(t, http.DefaultClient, url+"/plain/effects", "k1", `{}`); a.status != 503 {
		t.Fatalf("answer %+v", a)
	}
	if rec := record(s, "plain"); len(rec.Applications) != 0 || rec.Counts.Injected5xx != 1 {
		t.Fatalf("record %+v", rec)
	}
}

func TestLostResponseIsAppliedFirst(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{LoseResponse: 1}, NotBroken)
	if a := call(t, http.DefaultClient, url+"/plain/effects", "k1", `{}`); a.err == nil {
		t.Fatalf("answer %+v, want a broken connection", a)
	}
	if rec := record(s, "plain"); len(rec.Applications) != 1 || rec.Counts.LostResponses != 1 {
		t.Fatalf("record %+v", rec)
	}
}

func TestSlowResponseOutlastsTheCaller(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{Slow: 1, SlowDelay: time.Minute}, NotBroken)
	c := &http.Client{Timeout: 100 * time.Millisecond}
	if a := call(t, c, url+"/plain/effects", "k1", `{}`); a.err == nil {
		t.Fatalf("answer %+v, want the caller to time out", a)
	}
	if rec := record(s, "plain"); len(rec.Applications) != 1 || rec.Counts.SlowResponses != 1 {
		t.Fatalf("record %+v", rec)
	}
}

func TestLookupDown(t *testing.T) {
	t.Parallel()
	_, url := serve(t, Faults{LookupDown: 1}, NotBroken)
	if a := lookup(t, url+"/plain/effects/k1"); a.status != 503 {
		t.Fatalf("lookup %+v", a)
	}
}

func TestBrokenServices(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{}, DoubleApply)
	if a := call(t, http.DefaultClient, url+"/dedupe/effects", "k1", `{}`); a.status != 201 {
		t.Fatalf("answer %+v", a)
	}
	if rec := record(s, "dedupe"); len(rec.Applications) != 2 {
		t.Fatalf("double-apply recorded %d applications", len(rec.Applications))
	}

	s, url = serve(t, Faults{}, Lie)
	if a := call(t, http.DefaultClient, url+"/plain/effects", "k1", `{}`); a.status != 201 || a.id == "" {
		t.Fatalf("answer %+v", a)
	}
	if rec := record(s, "plain"); len(rec.Applications) != 0 {
		t.Fatalf("a lying service recorded %d applications", len(rec.Applications))
	}

	for _, name := range []string{"", "double-apply", "lie"} {
		if _, err := ParseBroken(name); err != nil {
			t.Errorf("ParseBroken(%q): %v", name, err)
		}
	}
	if _, err := ParseBroken("sometimes"); err == nil {
		t.Error("ParseBroken accepted an unknown name")
	}
}

// A cured poisoned body is applied like any other, once; Applied then
// answers for its key, as the provider's console would.
func TestCuredPoisonIsAppliedAndLookedUp(t *testing.T) {
	t.Parallel()
	s, url := serve(t, Faults{}, NotBroken)
	body := `{"poison":"terminal"}`
	if a := call(t, http.DefaultClient, url+"/dedupe/effects", "k1", body); a.status != 422 {
		t.Fatalf("before the cure: %+v", a)
	}
	if _, ok := s.Applied("dedupe", "k1"); ok {
		t.Fatal("Applied before any effect")
	}
	sum := sha256.Sum256([]byte(body))
	s.Cure(hex.EncodeToString(sum[:]))
	a := call(t, http.DefaultClient, url+"/dedupe/effects", "k1", body)
	if a.status != http.StatusCreated || a.id == "" {
		t.Fatalf("after the cure: %+v", a)
	}
	if id, ok := s.Applied("dedupe", "k1"); !ok || id != a.id {
		t.Fatalf("Applied = %q, %v; want %q", id, ok, a.id)
	}
	if a := call(t, http.DefaultClient, url+"/dedupe/effects", "k2", `{"poison":"retryable"}`); a.status != 503 {
		t.Fatalf("another poisoned body after one cure: %+v", a)
	}
	if rec := record(s, "dedupe"); len(rec.Applications) != 1 || rec.Counts.PoisonRefusals != 2 {
		t.Fatalf("record %+v", rec)
	}
}
