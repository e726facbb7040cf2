package handlers_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ackgate/ackgate/gate"
)

// brokenWriter is a connection that is gone by the time the answer is
// written: writes and flushes fail, as net/http's do after the client hung
// up or the write deadline passed.
type brokenWriter struct {
	header  http.Header
	status  int
	flushes int
}

var errConnGone = errors.New("connection gone")

func (w *brokenWriter) Header() http.Header {
	if w.header == nil {
		w.header = http.Header{}
	}
	return w.header
}
func (w *brokenWriter) WriteHeader(status int)    { w.status = status }
func (w *brokenWriter) Write([]byte) (int, error) { return 0, errConnGone }
func (w *brokenWriter) FlushError() error         { w.flushes++; return errConnGone }
func (w *brokenWriter) Flush()                    { _ = w.FlushError() }

// unflushable has no Flush at all: the handler cannot learn whether its
// answer reached the connection.
type unflushable struct{ rec *httptest.ResponseRecorder }

func (w unflushable) Header() http.Header         { return w.rec.Header() }
func (w unflushable) WriteHeader(status int)      { w.rec.WriteHeader(status) }
func (w unflushable) Write(b []byte) (int, error) { return w.rec.Write(b) }

// The ingest handler reports an ack as sent only when the answer reached the
// connection. When its flush fails, the operation must stay ack_pending: the
// broker may never have heard the ack, will redeliver, and the redelivery is
// what gets acked. Marking it acknowledged would claim an answer nobody got.
func TestAckNotWrittenLeavesOperationAckPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, routeYAML("orders", "unsafe", "broker", ""))
	serve := func(w http.ResponseWriter, m msg) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/v1/push/pubsub/orders", bytes.NewReader(envelope(m)))
		req.Header.Set("Content-Type", "application/json")
		e.gw.Ingest.ServeHTTP(w, req)
		for e.gw.After.Pending() > 0 { // the post-response work, off the handler's goroutine
			time.Sleep(time.Millisecond)
		}
	}

	broken := &brokenWriter{}
	lost := msg{ID: "m-lost", Data: "x"}
	serve(broken, lost)
	if broken.status != http.StatusNoContent || broken.flushes == 0 {
		t.Fatalf("the handler answered %d with %d flushes; want a 204 it tried to flush", broken.status, broken.flushes)
	}
	rec := e.record(e.opID("orders", lost))
	if rec.Operation.State != gate.StateAckPending || rec.Operation.AckedAt != nil {
		t.Fatalf("state %s, acked at %v, after an ack that never left; want ack_pending", rec.Operation.State, rec.Operation.AckedAt)
	}

	silent := msg{ID: "m-silent", Data: "y"}
	serve(unflushable{httptest.NewRecorder()}, silent)
	if st := e.record(e.opID("orders", silent)).Operation.State; st != gate.StateAckPending {
		t.Fatalf("state %s after an answer that could not be flushed; want ack_pending", st)
	}

	// The redelivery, answered on a working connection, is acked without a
	// second effect and marks the operation acknowledged.
	good := httptest.NewRecorder()
	serve(good, lost)
	if good.Code != http.StatusNoContent || !good.Flushed {
		t.Fatalf("redelivery answered %d (flushed %v)", good.Code, good.Flushed)
	}
	e.waitState(e.opID("orders", lost), gate.StateAcknowledged)
	if n := e.down.Applied(); n != 2 {
		t.Fatalf("downstream applied %d effects, want 2 (one per message)", n)
	}
}
