package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// downstream is the effect endpoint every system calls: as cheap as an HTTP
// handler can be, so that what is measured is the systems in front of it.
// It answers 201 with a result id in X-Result-Id, the evidence the route asks
// for. It does not deduplicate: the messages are unique, and a redelivery
// that reaches it is counted, which is itself a figure worth seeing.
type downstream struct {
	srv      *http.Server
	url      string
	calls    atomic.Int64
	keyless  atomic.Int64 // calls without an Idempotency-Key
	delay    atomic.Int64 // nanoseconds to wait before answering
	resultID atomic.Int64
	// mux takes further paths while it serves (handoff.go's).
	mux *http.ServeMux
}

func startDownstream(addr string) (*downstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	d := &downstream{url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effects", d.effect)
	d.mux = mux
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = d.srv.Serve(ln) }()
	return d, nil
}

func (d *downstream) effect(w http.ResponseWriter, r *http.Request) {
	d.calls.Add(1)
	if r.Header.Get("Idempotency-Key") == "" {
		d.keyless.Add(1)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	if delay := time.Duration(d.delay.Load()); delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("X-Result-Id", "r-"+strconv.FormatInt(d.resultID.Add(1), 10))
	w.WriteHeader(http.StatusCreated)
}

func (d *downstream) close(ctx context.Context) error { return d.srv.Shutdown(ctx) }

// forwarder is the naive push endpoint: decode, forward with the message id
// as Idempotency-Key, ack on a 2xx. No ledger and no lease, so a lost answer
// or a crash between the effect and the ack is simply retried by the broker
// and relies on the downstream's dedupe: the gateway's evidence is what it
// lacks, and the difference in cost is what the comparison shows.
type forwarder struct {
	srv    *http.Server
	url    string
	target string
	client *http.Client
}

func startForwarder(target string) (*forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &forwarder{
		url: "http://" + ln.Addr().String(), target: target + "/effects",
		client: &http.Client{
			Timeout:   5 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 4096, IdleConnTimeout: 2 * time.Minute},
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/push/pubsub/{route}", f.pubsub)
	mux.HandleFunc("POST /v1/push/sns/{route}", f.sns)
	f.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

func (f *forwarder) close(ctx context.Context) error {
	f.client.CloseIdleConnections()
	return f.srv.Shutdown(ctx)
}

// pushed is a message as the tool's own push endpoints (the forwarder's
// and the bare pipeline's) take it: where it came from, its id, its data.
type pushed struct {
	source, id string
	data       []byte
}

// decodePubSub reads a wrapped Pub/Sub push, answering 400 itself when it
// is not one.
func decodePubSub(w http.ResponseWriter, r *http.Request) (pushed, bool) {
	var env pubsubEnvelope
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&env); err != nil || env.Message.MessageID == "" {
		http.Error(w, "not a Pub/Sub push", http.StatusBadRequest)
		return pushed{}, false
	}
	data, err := base64.StdEncoding.DecodeString(env.Message.Data)
	if err != nil {
		http.Error(w, "data is not base64", http.StatusBadRequest)
		return pushed{}, false
	}
	return pushed{source: env.Subscription, id: env.Message.MessageID, data: data}, true
}

// decodeSNS reads an SNS notification, answering 400 itself when it is not
// one.
func decodeSNS(w http.ResponseWriter, r *http.Request) (pushed, bool) {
	var n snsNotification
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&n); err != nil || n.MessageID == "" || n.Type != "Notification" {
		http.Error(w, "not an SNS notification", http.StatusBadRequest)
		return pushed{}, false
	}
	return pushed{source: n.TopicArn, id: n.MessageID, data: []byte(n.Message)}, true
}

func (f *forwarder) pubsub(w http.ResponseWriter, r *http.Request) {
	if m, ok := decodePubSub(w, r); ok {
		f.forward(w, r, m.id, m.data)
	}
}

func (f *forwarder) sns(w http.ResponseWriter, r *http.Request) {
	if m, ok := decodeSNS(w, r); ok {
		f.forward(w, r, m.id, m.data)
	}
}

func (f *forwarder) forward(w http.ResponseWriter, r *http.Request, key string, data []byte) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, f.target, bytes.NewReader(data))
	if err != nil {
		http.Error(w, "request", http.StatusInternalServerError)
		return
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := f.client.Do(req)
	if err != nil {
		http.Error(w, "downstream unreachable", http.StatusServiceUnavailable)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		http.Error(w, "downstream answered "+resp.Status, http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
