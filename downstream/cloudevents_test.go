package downstream_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/ackgate/ackgate/downstream"
	"github.com/ackgate/ackgate/gate"
)

// attributes are a message's attributes as brokers let publishers write
// them: snake and camel case, names that differ only in case or
// punctuation, one too long for a CloudEvents name, one named like a
// CloudEvents attribute, non-ASCII and empty names, values with spaces,
// percent signs, line breaks and non-ASCII text.
var attributes = map[string]string{
	"event_type":             "created",
	"eventType":              "camel",
	"region":                 " eu west 1 ",
	"googclient_traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	"id":                     "not the event's id",
	"Ünïcode":                "ünïcödé 日本 100%",
	"":                       "no name",
	"multi\nline":            "a\r\nb",
}

// ceServer decodes every request it gets with the CloudEvents SDK, as a
// CloudEvents receiver would, and keeps the event and the raw request.
type ceServer struct {
	mu     sync.Mutex
	events []*event.Event
	errs   []error
	reqs   []*http.Request
}

func newCEServer(t *testing.T) (*ceServer, string) {
	s := &ceServer{}
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		ev, err := cehttp.NewEventFromHTTPRequest(r)
		s.mu.Lock()
		s.events, s.errs, s.reqs = append(s.events, ev), append(s.errs, err), append(s.reqs, r)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return s, srv.URL
}

func (s *ceServer) only(t *testing.T, isEvent bool) (*event.Event, *http.Request) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.events) != 1 {
		t.Fatalf("%d requests, want 1", len(s.events))
	}
	if isEvent && s.errs[0] != nil {
		t.Fatalf("the CloudEvents SDK cannot read the request: %v", s.errs[0])
	}
	return s.events[0], s.reqs[0]
}

func execute(t *testing.T, mode gate.BodyMode, data []byte, headers map[string]string) (*event.Event, *http.Request) {
	t.Helper()
	s, u := newCEServer(t)
	r := newRoute(u)
	r.Effect.BodyMode = mode
	r.Effect.Headers = headers
	req := newRequest(r)
	req.Message.Attributes = attributes
	if data != nil {
		req.Message.Data = data
	}
	if got := newClient(t).Execute(context.Background(), req); got.Outcome != gate.OutcomeConfirmed {
		t.Fatalf("got %+v", got)
	}
	return s.only(t, mode != gate.BodyRaw)
}

// Binary and structured mode carry the same event, which the CloudEvents
// SDK reads back: the context, the data (JSON as JSON, bytes as bytes), and
// every attribute as an extension with a valid name and its exact value.
func TestCloudEventModes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode        gate.BodyMode
		contentType string // of the HTTP request
	}{
		{downstream.BodyCloudEventBinary, "application/json"},
		{gate.BodyCloudEvent, "application/cloudevents+json"},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			t.Parallel()
			// A configured Content-Type and a configured ce-id cannot
			// replace the event's own.
			ev, req := execute(t, c.mode, nil, map[string]string{"Content-Type": "text/plain", "Ce-Id": "forged", "Authorization": "Bearer t"})
			if ct := req.Header.Get("Content-Type"); !strings.HasPrefix(ct, c.contentType) {
				t.Errorf("Content-Type %q, want %s", ct, c.contentType)
			}
			if binary := req.Header.Get("Ce-Id") != ""; binary != (c.mode == downstream.BodyCloudEventBinary) {
				t.Errorf("ce-id header present: %v in mode %s", binary, c.mode)
			}
			if req.Header.Get("Idempotency-Key") != "ik_abc" || req.Header.Get("Authorization") != "Bearer t" {
				t.Errorf("headers %v", req.Header)
			}
			if ev.ID() != "m-1" || ev.Source() != "projects/p/subscriptions/orders" || ev.Type() != "ackgate.orders" ||
				!ev.Time().Equal(publishTime) || ev.SpecVersion() != "1.0" || ev.DataContentType() != "application/json" {
				t.Errorf("event context %s", ev.Context)
			}
			var data map[string]any
			if err := ev.DataAs(&data); err != nil || data["order"] != "o-1" || data["qty"] != float64(2) {
				t.Errorf("data %s (%v)", ev.Data(), err)
			}
			checkExtensions(t, ev, c.mode == downstream.BodyCloudEventBinary)

			// Data that is not JSON arrives as the same bytes.
			raw := []byte{0xff, 0x00, 'a', 0x80}
			ev, _ = execute(t, c.mode, raw, nil)
			if ev.DataContentType() != "application/octet-stream" || string(ev.Data()) != string(raw) {
				t.Errorf("binary data: %s %q", ev.DataContentType(), ev.Data())
			}
		})
	}
}

// checkExtensions: every attribute is an extension whose name CloudEvents
// allows (lower-case letters and digits, at most 20), named by the
// documented rule, with its value intact.
func checkExtensions(t *testing.T, ev *event.Event, binary bool) {
	t.Helper()
	ext := ev.Extensions()
	if len(ext) != len(attributes) {
		t.Errorf("%d extensions for %d attributes: %v", len(ext), len(attributes), ext)
	}
	for name := range ext {
		if !event.IsExtensionNameValid(name) || len(name) > 20 || strings.ToLower(name) != name {
			t.Errorf("extension name %q is not a valid CloudEvents name", name)
		}
	}
	// Binary mode percent-encodes string values in ce-* headers, as the
	// HTTP binding asks; the SDK leaves decoding them to the receiver.
	values := map[string]bool{}
	for name, v := range ext {
		s, _ := v.(string)
		if binary {
			d, err := url.PathUnescape(s)
			if err != nil {
				t.Errorf("extension %s: %q is not percent-encoded: %v", name, s, err)
			}
			s = d
			ext[name] = d
		}
		values[s] = true
	}
	for name, v := range attributes {
		if !values[v] {
			t.Errorf("attribute %q: its value %q is not among the extensions", name, v)
		}
	}
	if ext["region"] != " eu west 1 " {
		t.Errorf("region = %q", ext["region"])
	}
	// event_type and eventType both make "eventtype": neither takes it.
	if _, ok := ext["eventtype"]; ok {
		t.Errorf("eventtype is taken though two attributes make it: %v", ext)
	}
}

// Raw mode sends the data as the body and every attribute as an
// X-Ackgate-Attr- header that decodes, by the documented rule, to the
// attribute's exact name and value.
func TestRawModeSendsAttributesAsHeaders(t *testing.T) {
	t.Parallel()
	_, req := execute(t, gate.BodyRaw, nil, nil)
	got := map[string]string{}
	for k, vs := range req.Header {
		rest, ok := strings.CutPrefix(strings.ToLower(k), strings.ToLower(downstream.AttributeHeaderPrefix))
		if !ok {
			continue
		}
		name, err := url.PathUnescape(rest)
		if err != nil {
			t.Fatalf("header %s: %v", k, err)
		}
		if len(vs) != 1 {
			t.Fatalf("header %s has %d values", k, len(vs))
		}
		v, err := url.PathUnescape(vs[0])
		if err != nil {
			t.Fatalf("header %s: value %q: %v", k, vs[0], err)
		}
		got[name] = v
	}
	if len(got) != len(attributes) {
		t.Errorf("%d attribute headers for %d attributes: %v", len(got), len(attributes), got)
	}
	for name, v := range attributes {
		if got[name] != v {
			t.Errorf("attribute %q: header says %q, want %q", name, got[name], v)
		}
	}
	if req.Header.Get(downstream.AttributeHeaderPrefix+"region") != "%20eu%20west%201%20" {
		t.Errorf("region header %q", req.Header.Get(downstream.AttributeHeaderPrefix+"region"))
	}
}
