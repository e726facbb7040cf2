package config

import (
	"errors"
	"fmt"
	"net/mail"
	"regexp"
	"strings"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
)

// The broker-authentication part of a route: which authenticator it names,
// what that authenticator needs, and the body forms that depend on it.

type oidcSpec struct {
	Audience       string `yaml:"audience"`
	ServiceAccount string `yaml:"service_account"`
	JWKSURL        string `yaml:"jwks_url"`
}

type basicAuthSpec struct {
	UsernameEnv string `yaml:"username_env"`
	PasswordEnv string `yaml:"password_env"`
}

// envNameRE is an environment variable name; secrets are referred to by
// name, so that they never sit in the routes file or in a route's JSON.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

func buildAuth(r *gate.Route, spec *routeSpec, errs *routeErrs) {
	var auth gate.Auth
	if spec.Auth != nil {
		auth = gate.Auth(*spec.Auth)
	}
	switch auth {
	case "":
		errs.add("auth", "required; write auth: none to accept unauthenticated deliveries")
	case gate.AuthNone:
	case gate.AuthOIDC:
		if r.Broker == gate.BrokerSNS {
			errs.add("auth", "oidc verifies Pub/Sub push tokens; an sns route uses sns_signature or basic")
		}
	case gate.AuthSNSSignature, gate.AuthBasic:
		if r.Broker == gate.BrokerPubSub {
			errs.add("auth", "%s is for sns routes; a pubsub route uses oidc (with verification_token_env if needed)", auth)
		}
	default:
		errs.add("auth", "%q is not an authenticator: use none, oidc (pubsub), sns_signature or basic (sns)", auth)
	}
	r.Auth = auth

	// OIDC push tokens.
	switch {
	case auth == gate.AuthOIDC && spec.OIDC == nil:
		errs.add("oidc", "required for auth: oidc: the token's audience and service_account")
	case auth != gate.AuthOIDC && spec.OIDC != nil:
		errs.add("oidc", "only applies to auth: oidc")
	case spec.OIDC != nil:
		o := spec.OIDC
		r.OIDC = &gate.OIDCAuth{Audience: o.Audience, ServiceAccount: o.ServiceAccount, JWKSURL: o.JWKSURL}
		if strings.TrimSpace(o.Audience) == "" || strings.TrimSpace(o.Audience) != o.Audience {
			errs.add("oidc.audience", "required, without surrounding spaces: the audience the push subscription puts in its tokens (by default its push endpoint URL)")
		}
		if a, err := mail.ParseAddress(o.ServiceAccount); err != nil || a.Address != o.ServiceAccount || a.Name != "" {
			errs.add("oidc.service_account", "%q must be the push subscription's service account email", o.ServiceAccount)
		}
		if o.JWKSURL != "" {
			if err := checkHTTPURL(o.JWKSURL); err != nil {
				errs.add("oidc.jwks_url", "%v", err)
			}
		}
	}

	// The legacy verification token is an extra check on Pub/Sub routes.
	if spec.VerificationTokenEnv != "" {
		r.VerificationTokenEnv = spec.VerificationTokenEnv
		switch {
		case r.Broker == gate.BrokerSNS:
			errs.add("verification_token_env", "only applies to pubsub routes")
		case !envNameRE.MatchString(spec.VerificationTokenEnv):
			errs.add("verification_token_env", "%q is not an environment variable name", spec.VerificationTokenEnv)
		}
	}

	// HTTP basic credentials.
	switch {
	case auth == gate.AuthBasic && spec.BasicAuth == nil:
		errs.add("basic_auth", "required for auth: basic: username_env and password_env")
	case auth != gate.AuthBasic && spec.BasicAuth != nil:
		errs.add("basic_auth", "only applies to auth: basic")
	case spec.BasicAuth != nil:
		b := spec.BasicAuth
		r.BasicAuth = &gate.BasicAuthEnv{UsernameEnv: b.UsernameEnv, PasswordEnv: b.PasswordEnv}
		if !envNameRE.MatchString(b.UsernameEnv) {
			errs.add("basic_auth.username_env", "%q is not an environment variable name", b.UsernameEnv)
		}
		if !envNameRE.MatchString(b.PasswordEnv) {
			errs.add("basic_auth.password_env", "%q is not an environment variable name", b.PasswordEnv)
		} else if b.PasswordEnv == b.UsernameEnv {
			errs.add("basic_auth.password_env", "must differ from username_env")
		}
	}

	// An authenticated SNS route says which topics it takes: without that, a
	// genuine message from anyone's topic would pass the signature check.
	if r.Broker == gate.BrokerSNS && (auth == gate.AuthSNSSignature || auth == gate.AuthBasic) && len(r.Sources) == 0 {
		errs.add("sources", "required for auth: %s: the topic ARNs this route accepts and confirms subscriptions for", auth)
	}

	// Body forms.
	switch r.Broker {
	case gate.BrokerPubSub:
		r.PubSubMode, _ = pubsubModes.parse(errs, "pubsub_mode", spec.PubSubMode)
		if spec.RawDelivery != nil {
			errs.add("raw_delivery", "only applies to sns routes; Pub/Sub's raw form is pubsub_mode: unwrapped")
		}
	case gate.BrokerSNS:
		if spec.PubSubMode != "" {
			errs.add("pubsub_mode", "only applies to pubsub routes")
		}
		if spec.RawDelivery != nil && *spec.RawDelivery {
			r.RawDelivery = true
			if auth != gate.AuthBasic {
				errs.add("raw_delivery", "raw messages carry no signature; accept them only with auth: basic")
			}
		}
	}
}

// ResolveCredentials reads the secrets that routes name by environment
// variable, once, at start. A variable that is unset or empty is an error
// naming the route and field; values are never part of an error.
func ResolveCredentials(routes []*gate.Route, getenv func(string) string) (map[string]brokerauth.Credentials, error) {
	var errs []error
	out := make(map[string]brokerauth.Credentials, len(routes))
	read := func(r *gate.Route, field, name string) brokerauth.Secret {
		v := getenv(name)
		if v == "" {
			errs = append(errs, fmt.Errorf("route %q: %s: environment variable %s is not set or empty", r.Name, field, name))
		}
		return brokerauth.NewSecret(v)
	}
	for _, r := range routes {
		var c brokerauth.Credentials
		if r.VerificationTokenEnv != "" {
			c.VerificationToken = read(r, "verification_token_env", r.VerificationTokenEnv)
		}
		if r.BasicAuth != nil {
			c.BasicUser = read(r, "basic_auth.username_env", r.BasicAuth.UsernameEnv)
			c.BasicPassword = read(r, "basic_auth.password_env", r.BasicAuth.PasswordEnv)
		}
		out[r.Name] = c
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
