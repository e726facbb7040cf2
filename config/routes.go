package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ackgate/ackgate/gate"
)

// Defaults applied to a route before it is validated. The package
// documentation explains each choice.
const (
	DefaultTenant            = "default"
	DefaultFingerprintVer    = 1
	DefaultEffectMethod      = "POST"
	DefaultEffectTimeout     = 5 * time.Second
	DefaultMaxAttempts       = 5
	DefaultPubSubAckDeadline = 10 * time.Second
	// SNSAckDeadline is not a default but a fact: SNS gives up on an HTTP
	// delivery after 15 s, whatever the route says.
	SNSAckDeadline = 15 * time.Second
	// DefaultPubSubBrokerRetention is Pub/Sub's default message retention.
	DefaultPubSubBrokerRetention = 7 * 24 * time.Hour
	// pubSubRetentionMargin is added to the broker retention for the default
	// evidence retention (7 d + 1 d = 8 d).
	pubSubRetentionMargin = 24 * time.Hour
	// SNSRedeliveryHorizon is how long after its first delivery SNS may
	// still deliver a message over HTTP/S: a delivery policy's retries span
	// at most 3,600 s (a hard SNS limit, whatever the subscription's custom
	// policy says; the default policy's three retries 20 s apart end far
	// sooner), and the last retry may itself take SNS's 15 s timeout.
	SNSRedeliveryHorizon = time.Hour + SNSAckDeadline
	DefaultSNSRetention  = 2 * time.Hour

	// Reconciler defaults for lookup routes: a first check half a minute
	// after the operation entered the lane, doubling up to a quarter of an
	// hour while the lookup cannot tell, five lookups a second per replica.
	DefaultReconcileInterval    = 30 * time.Second
	DefaultReconcileMaxInterval = 15 * time.Minute
	DefaultReconcileRate        = 5.0

	// A local statement gets 5 s by default, like an effect call; the
	// relay of a handoff route first retries after a second and backs off
	// to five minutes, so an outage is absorbed by the outbox.
	DefaultLocalTimeout    = 5 * time.Second
	DefaultHandoffRetryMin = time.Second
	DefaultHandoffRetryMax = 5 * time.Minute
	// MaxHandoffEffectTimeout bounds one relay call: it answers no broker,
	// but a pass must still end so a crashed replica's entry is taken up.
	MaxHandoffEffectTimeout = time.Hour
)

// Limits enforced by validation.
const (
	MinPubSubAckDeadline   = 10 * time.Second
	MaxPubSubAckDeadline   = 600 * time.Second
	MinPubSubRetention     = 10 * time.Minute
	MaxPubSubRetention     = 31 * 24 * time.Hour
	MaxAttemptsLimit       = 100
	MinReconcileInterval   = time.Second
	MaxReconcileInterval   = 24 * time.Hour
	MaxReconcileRate       = 1000.0
	maxRouteNameLen        = 63
	contractVersionHexLen  = 16
	lookupKeyPlaceholder   = "{key}"
	minStatus, maxStatus   = 100, 599
	successLow, successTop = 200, 299
)

// DefaultRetryableStatuses are answers that say "nothing happened, try
// again": timeouts, rate limits and transient server errors.
func DefaultRetryableStatuses() []int { return []int{408, 425, 429, 500, 502, 503, 504} }

// DefaultTerminalStatuses are answers a retry cannot change: the request
// itself is wrong, forbidden or aimed at something that is gone.
func DefaultTerminalStatuses() []int { return []int{400, 401, 403, 404, 410, 422} }

// fileSpec is the routes file as written. Optional scalars are pointers or
// strings so that "absent" and "zero" stay distinct until defaults apply;
// durations are strings so that a bad one is reported with its route and
// field.
type fileSpec struct {
	Routes []routeSpec `yaml:"routes"`
}

type routeSpec struct {
	Name            string           `yaml:"name"`
	Tenant          string           `yaml:"tenant"`
	Broker          string           `yaml:"broker"`
	Auth            *string          `yaml:"auth"`
	Sources         []string         `yaml:"sources"`
	OperationKey    *keySpec         `yaml:"operation_key"`
	Fingerprint     *fingerprintSpec `yaml:"fingerprint"`
	Effect          *effectSpec      `yaml:"effect"`
	Shape           string           `yaml:"shape"`
	DedupeWindow    string           `yaml:"dedupe_window"`
	Reconcile       *reconcileSpec   `yaml:"reconcile"`
	Local           *localSpec       `yaml:"local"`
	Handoff         *handoffSpec     `yaml:"handoff"`
	MaxAttempts     *int             `yaml:"max_attempts"`
	DeadLetter      string           `yaml:"dead_letter"`
	AckDeadline     string           `yaml:"ack_deadline"`
	Renewal         *renewalSpec     `yaml:"renewal"`
	Retention       string           `yaml:"retention"`
	BrokerRetention string           `yaml:"broker_retention"`
	Private         []string         `yaml:"private"`

	// Broker authentication and body form (auth.go).
	OIDC                 *oidcSpec      `yaml:"oidc"`
	VerificationTokenEnv string         `yaml:"verification_token_env"`
	BasicAuth            *basicAuthSpec `yaml:"basic_auth"`
	PubSubMode           string         `yaml:"pubsub_mode"`
	RawDelivery          *bool          `yaml:"raw_delivery"`
}

type keySpec struct {
	Kind string `yaml:"kind"`
	Name string `yaml:"name"`
}

type fingerprintSpec struct {
	Version    *int     `yaml:"version"`
	Data       *bool    `yaml:"data"`
	Attributes []string `yaml:"attributes"`
	Pointers   []string `yaml:"pointers"`
}

type effectSpec struct {
	Method            string            `yaml:"method"`
	URL               string            `yaml:"url"`
	BodyMode          string            `yaml:"body_mode"`
	Headers           map[string]string `yaml:"headers"`
	Timeout           string            `yaml:"timeout"`
	Evidence          string            `yaml:"evidence"`
	ResultIDHeader    string            `yaml:"result_id_header"`
	ResultIDPointer   string            `yaml:"result_id_pointer"`
	TerminalStatuses  *[]int            `yaml:"terminal_statuses"`
	RetryableStatuses *[]int            `yaml:"retryable_statuses"`
	LookupURL         string            `yaml:"lookup_url"`
}

type reconcileSpec struct {
	Interval      string   `yaml:"interval"`
	MaxInterval   string   `yaml:"max_interval"`
	RatePerSecond *float64 `yaml:"rate_per_second"`
}

// localSpec is a local route's statement. Each params entry is one of
// data_json, data_bytes, idempotency_key, operation_id, message_id or
// attribute:NAME, bound in order to $1, $2, ...
type localSpec struct {
	SQL     string   `yaml:"sql"`
	Params  []string `yaml:"params"`
	Role    string   `yaml:"role"`
	Timeout string   `yaml:"timeout"`
}

type handoffSpec struct {
	RetryMin string `yaml:"retry_min"`
	RetryMax string `yaml:"retry_max"`
}

type renewalSpec struct {
	Interval     string `yaml:"interval"`
	MaxExtension string `yaml:"max_extension"`
}

// LoadRoutes reads, defaults and validates the routes file at path.
func LoadRoutes(path string) ([]*gate.Route, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	routes, err := ParseRoutes(data)
	if err != nil {
		return nil, fmt.Errorf("routes file %s: %w", path, err)
	}
	return routes, nil
}

// ParseRoutes decodes a routes document strictly (unknown fields are errors),
// applies defaults, validates every route and stamps each with its
// ContractVersion. All problems are reported together, each naming its route
// and field.
func ParseRoutes(data []byte) ([]*gate.Route, error) {
	var f fileSpec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no routes: the file is empty")
		}
		return nil, decodeError(data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document; put every route under one top-level routes: list")
	}
	if len(f.Routes) == 0 {
		return nil, errors.New("no routes: the top-level routes: list is empty or missing")
	}

	var errs []error
	routes := make([]*gate.Route, 0, len(f.Routes))
	seen := make(map[string]int, len(f.Routes))
	for i := range f.Routes {
		spec := &f.Routes[i]
		label := routeLabel(spec.Name, i)
		if first, dup := seen[spec.Name]; dup && spec.Name != "" {
			errs = append(errs, fmt.Errorf("%s: name: already used by route #%d", label, first+1))
		} else {
			seen[spec.Name] = i
		}
		r, rerrs := buildRoute(spec)
		for _, e := range rerrs {
			errs = append(errs, fmt.Errorf("%s: %w", label, e))
		}
		if len(rerrs) == 0 {
			r.ContractVersion = ContractVersion(r)
			routes = append(routes, r)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return routes, nil
}

// ContractVersion is a short, stable hash of the route's canonical JSON (the
// route after defaults, lists sorted where order carries no meaning), with
// ContractVersion itself left out. Any change to the contract changes it.
func ContractVersion(r *gate.Route) string {
	c := *r
	c.ContractVersion = ""
	b, err := json.Marshal(&c)
	if err != nil {
		// A Route holds only strings, numbers, bools, slices and a string map.
		panic("config: encoding route for its contract version: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:contractVersionHexLen]
}

// AuthNoneWarnings returns one line for every route that accepts
// unauthenticated deliveries, for serve and check-config to print.
func AuthNoneWarnings(routes []*gate.Route) []string {
	var out []string
	for _, r := range routes {
		if r.Auth != AuthNone {
			continue
		}
		w := fmt.Sprintf("route %q: auth: none: deliveries are not authenticated; anyone who can reach the ingest listener can submit messages to this route", r.Name)
		if len(r.Sources) == 0 {
			w += ", from any subscription or topic (no sources are listed)"
		}
		if r.VerificationTokenEnv != "" {
			w += "; only the legacy verification token is checked"
		}
		out = append(out, w)
	}
	return out
}

// AuthNone accepts unauthenticated deliveries. It has to be written out
// explicitly, and every route using it is reported by AuthNoneWarnings.
const AuthNone = gate.AuthNone

func routeLabel(name string, i int) string {
	if name == "" {
		return fmt.Sprintf("route #%d", i+1)
	}
	return fmt.Sprintf("route %q", name)
}

var (
	lineRE         = regexp.MustCompile(`^line (\d+): `)
	unknownFieldRE = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)
)

// decodeError rewrites yaml's type errors so that each names the route it
// occurred in, and unknown fields read as such.
func decodeError(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	starts := routeStarts(data)
	errs := make([]error, 0, len(te.Errors))
	for _, msg := range te.Errors {
		line := 0
		if m := lineRE.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		if m := unknownFieldRE.FindStringSubmatch(msg); m != nil {
			msg = fmt.Sprintf("line %s: unknown field %q", m[1], m[2])
		}
		label := ""
		for i, s := range starts {
			if line >= s.line {
				label = routeLabel(s.name, i)
			}
		}
		if label != "" {
			msg = label + ": " + msg
		}
		errs = append(errs, errors.New(msg))
	}
	return errors.Join(errs...)
}

type routeStart struct {
	line int
	name string
}

// routeStarts finds where each item of the routes list begins, and its name,
// from the document's node tree.
func routeStarts(data []byte) []routeStart {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil
	}
	var list *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "routes" {
			list = top.Content[i+1]
		}
	}
	if list == nil || list.Kind != yaml.SequenceNode {
		return nil
	}
	out := make([]routeStart, 0, len(list.Content))
	for _, item := range list.Content {
		s := routeStart{line: item.Line}
		if item.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(item.Content); i += 2 {
				if item.Content[i].Value == "name" {
					s.name = item.Content[i+1].Value
				}
			}
		}
		out = append(out, s)
	}
	return out
}
