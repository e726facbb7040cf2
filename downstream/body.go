package downstream

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/ackgate/ackgate/gate"
)

const (
	contentTypeOctet      = "application/octet-stream"
	contentTypeJSON       = "application/json"
	contentTypeCloudEvent = "application/cloudevents+json; charset=UTF-8"
)

// cloudEvent is the CloudEvents 1.0 structured JSON form. Data is carried as
// JSON when the message data is JSON, so that a receiver can read it without
// decoding base64, and as data_base64 otherwise, because arbitrary bytes do
// not survive as a JSON string.
type cloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            string          `json:"time,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      []byte          `json:"data_base64,omitempty"`
}

// cloudEventType names the route in the event, so that a receiver can route on
// it without knowing ackgate's configuration.
func cloudEventType(route string) string { return "ackgate." + route }

// encodeBody returns the effect body and its content type for the route's
// body mode.
func encodeBody(r *gate.Route, m *gate.Message) ([]byte, string, error) {
	switch r.Effect.BodyMode {
	case gate.BodyRaw, "":
		return m.Data, contentTypeOctet, nil
	case gate.BodyEnvelope:
		return m.Envelope, contentTypeJSON, nil
	case gate.BodyCloudEvent:
		b, err := encodeCloudEvent(r, m)
		return b, contentTypeCloudEvent, err
	default:
		return nil, "", fmt.Errorf("unknown body mode %q", r.Effect.BodyMode)
	}
}

func encodeCloudEvent(r *gate.Route, m *gate.Message) ([]byte, error) {
	ev := cloudEvent{
		SpecVersion: "1.0",
		ID:          m.MessageID,
		Source:      m.Source,
		Type:        cloudEventType(r.Name),
	}
	if ev.Source == "" {
		// source is REQUIRED and non-empty; the broker is the next best
		// description of where the event came from.
		ev.Source = "ackgate:" + string(m.Broker)
	}
	if !m.PublishTime.IsZero() {
		ev.Time = m.PublishTime.UTC().Format(time.RFC3339Nano)
	}
	switch {
	case len(m.Data) == 0:
		// No data: CloudEvents lets both data members be absent.
	case json.Valid(m.Data):
		ev.DataContentType = contentTypeJSON
		ev.Data = m.Data // Marshal compacts it
	default:
		ev.DataContentType = contentTypeOctet
		ev.DataBase64 = m.Data
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("cloudevent: %w", err)
	}
	return b, nil
}

// sendOnce is the effect request body. It is deliberately a type net/http does
// not recognise: http.NewRequest gives *bytes.Reader, *bytes.Buffer and
// *strings.Reader bodies a GetBody, and a GetBody is what lets the Transport
// rewind and resend a request on its own.
// It reads the slice itself, one allocation per request where a wrapped
// bytes.Reader took two.
type sendOnce struct {
	b   []byte
	off int
}

func newSendOnce(b []byte) *sendOnce { return &sendOnce{b: b} }

func (s *sendOnce) Read(p []byte) (int, error) {
	if s.off >= len(s.b) {
		return 0, io.EOF
	}
	n := copy(p, s.b[s.off:])
	s.off += n
	return n, nil
}

func (s *sendOnce) Close() error { return nil }
