package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Where the generated messages claim to come from. The route the tool writes
// accepts any source; these only have to be well formed.
const (
	pubsubSubscription = "projects/loadgen/subscriptions/loadgen-push"
	snsTopic           = "arn:aws:sns:us-east-1:000000000000:loadgen"
)

// message is one delivery as a broker would send it, built once so that
// encoding costs nothing inside the measured loop.
type message struct {
	ID   string
	SNS  bool
	Data []byte
	Body []byte // the wire body: a wrapped Pub/Sub push, or an SNS notification
}

// generator makes the messages of one phase. IDs carry the run and phase, so
// that a second run against the same gateway (-target) never meets the ids of
// the first, and within a phase every index gives a different id and data.
type generator struct {
	prefix  string // run and phase
	payload int
	sns     float64
	now     func() time.Time
}

func newGenerator(run, phase string, payload int, sns float64) *generator {
	return &generator{prefix: run + "-" + phase, payload: payload, sns: sns, now: time.Now}
}

func (g *generator) message(i int) message {
	id := g.prefix + "-" + strconv.Itoa(i)
	m := message{ID: id, SNS: picked(i, g.sns), Data: payload(id, i, g.payload)}
	published := g.now().UTC().Format(time.RFC3339Nano)
	var err error
	if m.SNS {
		m.Body, err = json.Marshal(snsNotification{
			Type: "Notification", MessageID: id, TopicArn: snsTopic,
			Message: string(m.Data), Timestamp: published,
		})
	} else {
		var env pubsubEnvelope
		env.Message.Data = base64.StdEncoding.EncodeToString(m.Data)
		env.Message.Attributes = map[string]string{"event_type": "created"}
		env.Message.MessageID = id
		env.Message.PublishTime = published
		env.Subscription = pubsubSubscription
		m.Body, err = json.Marshal(env)
	}
	if err != nil {
		// Only strings and maps of strings are encoded: this cannot fail.
		panic(fmt.Sprintf("loadgen: encoding message %d: %v", i, err))
	}
	return m
}

// pubsubEnvelope is Pub/Sub's wrapped push body.
type pubsubEnvelope struct {
	Message struct {
		Data        string            `json:"data"`
		Attributes  map[string]string `json:"attributes,omitempty"`
		MessageID   string            `json:"messageId"`
		PublishTime string            `json:"publishTime"`
	} `json:"message"`
	Subscription string `json:"subscription"`
}

// snsNotification is an SNS Notification without a signature: the SNS route
// the tool writes uses auth: none, so verification is not part of what is
// measured.
type snsNotification struct {
	Type      string `json:"Type"`
	MessageID string `json:"MessageId"`
	TopicArn  string `json:"TopicArn"`
	Message   string `json:"Message"`
	Timestamp string `json:"Timestamp"`
}

// payload is n bytes of JSON that differ for every message, as real events
// do, so that nothing downstream of the fingerprint can be cached.
func payload(id string, i, n int) []byte {
	head := `{"order":"` + id + `","amount":` + strconv.Itoa(i%100000) + `,"pad":"`
	const tail = `"}`
	pad := n - len(head) - len(tail)
	if pad < 0 {
		// Too small for the JSON: plain text of exactly n bytes.
		sum := sha256.Sum256([]byte(id))
		return []byte(strings.Repeat(fmt.Sprintf("%x", sum), n/64+1)[:n])
	}
	return []byte(head + strings.Repeat("x", pad) + tail)
}

// picked spreads a share of the indices evenly: index i is picked when the
// running total floor((i+1)*share) steps up, so exactly floor(n*share) of
// the first n are picked, without randomness that would differ between
// systems.
func picked(i int, share float64) bool {
	if share <= 0 {
		return false
	}
	if share >= 1 {
		return true
	}
	return int64(float64(i+1)*share) > int64(float64(i)*share)
}
