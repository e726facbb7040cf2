package brokerauth

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// GoogleJWKSURL is where Google publishes the keys that sign Pub/Sub push
// tokens.
const GoogleJWKSURL = "https://www.googleapis.com/oauth2/v3/certs"

// googleIssuer is the issuer go-oidc checks; it also accepts Google's
// scheme-less "accounts.google.com", and nothing else.
const googleIssuer = "https://accounts.google.com"

// Defaults of OIDCOptions.
const (
	DefaultKeysMaxAge = time.Hour
	DefaultMinRefresh = 30 * time.Second
	// iatLeeway allows for clock skew on "issued at", as go-oidc does on nbf.
	iatLeeway = 5 * time.Minute
)

// OIDCOptions configures an OIDCVerifier.
type OIDCOptions struct {
	// DefaultJWKSURL is used by routes that name none; GoogleJWKSURL when
	// empty.
	DefaultJWKSURL string
	// HTTPClient fetches key sets; redirects are never followed.
	HTTPClient *http.Client
	// KeysMaxAge is how long fetched keys are used before they are fetched
	// again; MinRefresh is the least time between two fetches triggered by
	// a token with an unknown kid.
	KeysMaxAge   time.Duration
	MinRefresh   time.Duration
	FetchTimeout time.Duration
	Now          func() time.Time
}

// OIDCVerifier checks Pub/Sub push tokens: RS256 JWTs issued by Google for a
// route's audience and service account. go-oidc does the JWT work (algorithm
// allow-list, signature through our cached key set, issuer, expiry,
// not-before); the route-specific claims are checked here. Safe for
// concurrent use; one per process.
type OIDCVerifier struct {
	o      OIDCOptions
	client *http.Client

	mu   sync.Mutex
	sets map[string]*keySet
}

// NewOIDCVerifier applies defaults.
func NewOIDCVerifier(o OIDCOptions) *OIDCVerifier {
	if o.DefaultJWKSURL == "" {
		o.DefaultJWKSURL = GoogleJWKSURL
	}
	if o.KeysMaxAge <= 0 {
		o.KeysMaxAge = DefaultKeysMaxAge
	}
	if o.MinRefresh <= 0 {
		o.MinRefresh = DefaultMinRefresh
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &OIDCVerifier{o: o, client: noRedirectClient(o.HTTPClient, o.FetchTimeout), sets: map[string]*keySet{}}
}

// PushExpectation is what a route requires of a push token.
type PushExpectation struct {
	Audience       string
	ServiceAccount string
	// JWKSURL overrides the verifier's default key set.
	JWKSURL string
}

// PushIdentity is what a verified token said.
type PushIdentity struct {
	Email   string
	Subject string
	Expiry  time.Time
}

// pushClaims are the claims beyond go-oidc's standard ones.
type pushClaims struct {
	Email         string `json:"email"`
	EmailVerified any    `json:"email_verified"`
}

// VerifyPush checks the Authorization header of a push request against want.
//
//   - Unauthenticated: no bearer token; not a JWT; an algorithm other than
//     RS256 (alg none included); an unknown key; a bad signature; another
//     issuer; expired, not yet valid, or issued in the future.
//   - Forbidden: a genuine Google token for another audience or service
//     account, or whose email is not verified.
//   - Unavailable: the key set cannot be fetched and no keys are cached.
func (v *OIDCVerifier) VerifyPush(ctx context.Context, authorization string, want PushExpectation) (*PushIdentity, error) {
	scheme, raw, ok := strings.Cut(authorization, " ")
	raw = strings.TrimSpace(raw)
	if !ok || !strings.EqualFold(scheme, "Bearer") || raw == "" {
		return nil, fail(Unauthenticated, nil, "bearer token is missing")
	}
	if want.Audience == "" || want.ServiceAccount == "" {
		return nil, fail(Forbidden, nil, "route has no audience or service account to check the token against")
	}
	ks := v.keySet(want.JWKSURL)
	verifier := oidc.NewVerifier(googleIssuer, ks, &oidc.Config{
		// The audience is checked below, so that a wrong audience is told
		// apart from a token that does not verify.
		SkipClientIDCheck:    true,
		SupportedSigningAlgs: []string{oidc.RS256},
		Now:                  v.o.Now,
	})
	ctx, st := withFetchState(ctx)
	tok, err := verifier.Verify(ctx, raw)
	if err != nil {
		var expired *oidc.TokenExpiredError
		switch {
		case st.err != nil:
			return nil, fail(Unavailable, st.err, "token signing keys cannot be fetched now")
		case errors.As(err, &expired):
			return nil, fail(Unauthenticated, err, "token has expired")
		default:
			return nil, fail(Unauthenticated, err, "token does not verify")
		}
	}
	if tok.IssuedAt.IsZero() || tok.IssuedAt.After(v.o.Now().Add(iatLeeway)) {
		return nil, fail(Unauthenticated, nil, "token has no issue time or was issued in the future")
	}
	var c pushClaims
	if err := tok.Claims(&c); err != nil {
		return nil, fail(Unauthenticated, err, "token claims cannot be read")
	}
	if !slices.Contains(tok.Audience, want.Audience) {
		return nil, fail(Forbidden, nil, "token audience is not this route's")
	}
	if !strings.EqualFold(c.Email, want.ServiceAccount) {
		return nil, fail(Forbidden, nil, "token is for another service account")
	}
	if verified, _ := c.EmailVerified.(bool); !verified {
		return nil, fail(Forbidden, nil, "token email is not verified")
	}
	return &PushIdentity{Email: c.Email, Subject: tok.Subject, Expiry: tok.Expiry}, nil
}

func (v *OIDCVerifier) keySet(url string) *keySet {
	if url == "" {
		url = v.o.DefaultJWKSURL
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	ks, ok := v.sets[url]
	if !ok {
		ks = &keySet{
			url: url, client: v.client, timeout: v.o.FetchTimeout,
			maxAge: v.o.KeysMaxAge, minRefresh: v.o.MinRefresh, now: v.o.Now,
		}
		v.sets[url] = ks
	}
	return ks
}
