package gate

import (
	"encoding/json"
	"fmt"
	"time"
)

// Route contracts are read by people (GET /v1/routes) as much as by programs,
// so their durations travel as Go duration strings ("10s", "168h0m0s"), the
// same spelling the routes file uses, not as nanosecond integers.

type jsonDuration time.Duration

func (d jsonDuration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *jsonDuration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = jsonDuration(v)
	return nil
}

type routeAlias Route

type routeJSON struct {
	*routeAlias
	DedupeWindow jsonDuration `json:"dedupe_window"`
	AckDeadline  jsonDuration `json:"ack_deadline"`
	Retention    jsonDuration `json:"retention"`
}

func (r Route) MarshalJSON() ([]byte, error) {
	a := routeAlias(r)
	return json.Marshal(routeJSON{&a, jsonDuration(r.DedupeWindow), jsonDuration(r.AckDeadline), jsonDuration(r.Retention)})
}

func (r *Route) UnmarshalJSON(b []byte) error {
	j := routeJSON{routeAlias: (*routeAlias)(r)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	r.DedupeWindow, r.AckDeadline, r.Retention = time.Duration(j.DedupeWindow), time.Duration(j.AckDeadline), time.Duration(j.Retention)
	return nil
}

type effectAlias EffectSpec

type effectJSON struct {
	*effectAlias
	Timeout jsonDuration `json:"timeout"`
}

func (e EffectSpec) MarshalJSON() ([]byte, error) {
	a := effectAlias(e)
	return json.Marshal(effectJSON{&a, jsonDuration(e.Timeout)})
}

func (e *EffectSpec) UnmarshalJSON(b []byte) error {
	j := effectJSON{effectAlias: (*effectAlias)(e)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	e.Timeout = time.Duration(j.Timeout)
	return nil
}

type renewalJSON struct {
	Interval     jsonDuration `json:"interval"`
	MaxExtension jsonDuration `json:"max_extension"`
}

func (r Renewal) MarshalJSON() ([]byte, error) {
	return json.Marshal(renewalJSON{jsonDuration(r.Interval), jsonDuration(r.MaxExtension)})
}

func (r *Renewal) UnmarshalJSON(b []byte) error {
	var j renewalJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	r.Interval, r.MaxExtension = time.Duration(j.Interval), time.Duration(j.MaxExtension)
	return nil
}

type reconcileJSON struct {
	Interval      jsonDuration `json:"interval"`
	MaxInterval   jsonDuration `json:"max_interval"`
	RatePerSecond float64      `json:"rate_per_second"`
}

func (p ReconcilePolicy) MarshalJSON() ([]byte, error) {
	return json.Marshal(reconcileJSON{jsonDuration(p.Interval), jsonDuration(p.MaxInterval), p.RatePerSecond})
}

func (p *ReconcilePolicy) UnmarshalJSON(b []byte) error {
	var j reconcileJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	p.Interval, p.MaxInterval, p.RatePerSecond = time.Duration(j.Interval), time.Duration(j.MaxInterval), j.RatePerSecond
	return nil
}

type handoffJSON struct {
	RetryMin jsonDuration `json:"retry_min"`
	RetryMax jsonDuration `json:"retry_max"`
}

func (h HandoffSpec) MarshalJSON() ([]byte, error) {
	return json.Marshal(handoffJSON{jsonDuration(h.RetryMin), jsonDuration(h.RetryMax)})
}

func (h *HandoffSpec) UnmarshalJSON(b []byte) error {
	var j handoffJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	h.RetryMin, h.RetryMax = time.Duration(j.RetryMin), time.Duration(j.RetryMax)
	return nil
}
