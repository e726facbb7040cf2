package handlers

import (
	"context"
	"net/http"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/gate"
)

// BrokerAuth is what the ingest handlers need to authenticate deliveries and
// to handle SNS subscription messages. A route whose authenticator is missing
// here is refused with a 503 (fail closed, and the broker retries once the
// gateway is configured), never let through.
type BrokerAuth struct {
	// OIDC verifies Pub/Sub push tokens (auth: oidc).
	OIDC *brokerauth.OIDCVerifier
	// SNS verifies SNS signatures and confirms subscriptions.
	SNS *brokerauth.SNSVerifier
	// Credentials are the routes' shared secrets, by route name.
	Credentials map[string]brokerauth.Credentials
	// Subscriptions records SNS subscription messages.
	Subscriptions SubscriptionLog
	// ConfirmationMaxAge bounds the age of a SubscriptionConfirmation, by its
	// signed Timestamp, that is still confirmed; DefaultConfirmationMaxAge
	// when zero.
	ConfirmationMaxAge time.Duration
}

// DefaultConfirmationMaxAge is as long as SNS keeps retrying a delivery: a
// genuine confirmation arrives within it, and an older copy can only be a
// replay.
const DefaultConfirmationMaxAge = time.Hour

// SubscriptionLog is the durable record of SNS subscription messages. Each
// message (route and MessageId) is claimed before it is acted on and settled
// with its recorded outcome, so that copies of it are answered from the
// record instead of being acted on again.
type SubscriptionLog interface {
	Claim(ctx context.Context, route, messageID string, lease time.Duration) (adminapi.SubscriptionClaim, error)
	Settle(ctx context.Context, c adminapi.SubscriptionClaim, e *adminapi.SubscriptionEvent) error
}

func notConfigured(what string) error {
	return &brokerauth.Error{Kind: brokerauth.Unavailable, Reason: what + " is not configured on this gateway"}
}

// authenticatePubSub runs a Pub/Sub route's authenticator on the request's
// headers and query, before the body is read: an unauthenticated push costs
// no body read and reaches nothing.
func (o *IngestOptions) authenticatePubSub(r *http.Request, route *gate.Route) error {
	switch route.Auth {
	case gate.AuthNone:
	case gate.AuthOIDC:
		if o.Auth.OIDC == nil || route.OIDC == nil {
			return notConfigured("the OIDC verifier")
		}
		want := brokerauth.PushExpectation{
			Audience: route.OIDC.Audience, ServiceAccount: route.OIDC.ServiceAccount, JWKSURL: route.OIDC.JWKSURL,
		}
		if _, err := o.Auth.OIDC.VerifyPush(r.Context(), r.Header.Get("Authorization"), want); err != nil {
			return err
		}
	default:
		return notConfigured("authenticator " + string(route.Auth) + " for pubsub")
	}
	if route.VerificationTokenEnv != "" {
		creds, ok := o.Auth.Credentials[route.Name]
		if !ok || !creds.VerificationToken.IsSet() {
			return notConfigured("the route's verification token")
		}
		if err := brokerauth.CheckVerificationToken(creds.VerificationToken, r.URL.Query().Get("token")); err != nil {
			return err
		}
	}
	return nil
}

// checkBasic checks an auth: basic route's credentials.
func (o *IngestOptions) checkBasic(r *http.Request, route *gate.Route) error {
	creds, ok := o.Auth.Credentials[route.Name]
	if !ok || !creds.BasicUser.IsSet() || !creds.BasicPassword.IsSet() {
		return notConfigured("the route's basic credentials")
	}
	return brokerauth.CheckBasic(creds.BasicUser, creds.BasicPassword, r.Header.Get("Authorization"))
}

// challenge names the expected scheme on a 401, as HTTP asks; SNS sends basic
// credentials once it has been challenged.
func challenge(w http.ResponseWriter, route *gate.Route, err error) {
	if brokerauth.KindOf(err) != brokerauth.Unauthenticated || route == nil {
		return
	}
	switch route.Auth {
	case gate.AuthOIDC:
		w.Header().Set("WWW-Authenticate", `Bearer realm="ackgate"`)
	case gate.AuthBasic:
		w.Header().Set("WWW-Authenticate", `Basic realm="ackgate", charset="UTF-8"`)
	}
}
