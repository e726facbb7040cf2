package brokerauth

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

const (
	// maxJWKSBytes bounds a key set download; Google's is about 2 KB.
	maxJWKSBytes = 1 << 20
	// retryAfterFailure is how long a failed fetch answers for the next ones.
	retryAfterFailure = time.Second
)

// errUnknownKey is a token whose kid is in no key set we have, even after a
// refresh (or while refreshes are rate-limited).
var errUnknownKey = errors.New("token is signed with an unknown key")

// keySet is a JWKS URL's RSA keys, cached. It implements go-oidc's KeySet:
// go-oidc checks the algorithm, issuer, expiry and not-before, and calls
// VerifySignature for the signature.
//
// Keys are refetched when they are older than maxAge, and when a token names
// a kid we do not know (Google rotates keys and announces new ones in the
// set), but not more often than minRefresh so that tokens with made-up kids
// cannot turn the gateway into a fetch amplifier. When a refetch fails, keys
// we already have are still used; with none at all, the failure is marked
// Unavailable on the context's fetchState.
type keySet struct {
	url        string
	client     *http.Client
	timeout    time.Duration
	maxAge     time.Duration
	minRefresh time.Duration
	now        func() time.Time

	fetchMu sync.Mutex // one fetch at a time
	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetched time.Time // last successful fetch
	tried   time.Time // last attempt
	lastErr error     // of the last attempt
}

// fetchState carries "the key set could not be fetched" out of
// VerifySignature, whose errors go-oidc flattens into strings.
type fetchState struct{ err error }

type fetchStateKey struct{}

func withFetchState(ctx context.Context) (context.Context, *fetchState) {
	st := &fetchState{}
	return context.WithValue(ctx, fetchStateKey{}, st), st
}

func markUnavailable(ctx context.Context, err error) {
	if st, ok := ctx.Value(fetchStateKey{}).(*fetchState); ok {
		st.err = err
	}
}

// VerifySignature implements oidc.KeySet.
func (s *keySet) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	jws, err := jose.ParseSigned(jwt, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		return nil, fmt.Errorf("malformed jwt: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("token must carry exactly one signature")
	}
	kid := jws.Signatures[0].Header.KeyID

	keys, err := s.current(ctx)
	if err != nil {
		markUnavailable(ctx, err)
		return nil, err
	}
	payload, known := verifyJWS(jws, keys, kid)
	if payload != nil {
		return payload, nil
	}
	if known {
		return nil, errors.New("token signature does not verify")
	}
	keys, err = s.refreshForUnknownKid(ctx)
	if err != nil {
		markUnavailable(ctx, err)
		return nil, err
	}
	if payload, _ := verifyJWS(jws, keys, kid); payload != nil {
		return payload, nil
	}
	return nil, errUnknownKey
}

// verifyJWS tries the keys with the token's kid (every key when it has none).
// known says whether any key had that kid.
func verifyJWS(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) (payload []byte, known bool) {
	for i := range keys {
		if kid != "" && keys[i].KeyID != kid {
			continue
		}
		known = true
		if p, err := jws.Verify(&keys[i]); err == nil {
			return p, true
		}
	}
	return nil, known
}

// current returns the cached keys, fetching them first when there are none
// or they are older than maxAge.
func (s *keySet) current(ctx context.Context) ([]jose.JSONWebKey, error) {
	s.mu.Lock()
	keys, fresh := s.keys, len(s.keys) > 0 && s.now().Sub(s.fetched) < s.maxAge
	s.mu.Unlock()
	if fresh {
		return keys, nil
	}
	got, err := s.refresh(ctx, func() bool {
		return len(s.keys) > 0 && s.now().Sub(s.fetched) < s.maxAge
	})
	if err != nil && len(keys) > 0 {
		return keys, nil // stale keys beat no keys
	}
	return got, err
}

func (s *keySet) refreshForUnknownKid(ctx context.Context) ([]jose.JSONWebKey, error) {
	s.mu.Lock()
	keys, recent := s.keys, !s.tried.IsZero() && s.now().Sub(s.tried) < s.minRefresh
	s.mu.Unlock()
	if recent {
		return keys, nil
	}
	got, err := s.refresh(ctx, func() bool { return s.now().Sub(s.tried) < s.minRefresh })
	if err != nil && len(keys) > 0 {
		return keys, nil
	}
	return got, err
}

// refresh fetches the key set unless, once it holds the fetch lock, skip
// (called under mu) says another caller has just done it, or the last attempt
// failed less than retryAfterFailure ago: during an outage, waiting requests
// share one failure instead of queueing one fetch each.
func (s *keySet) refresh(ctx context.Context, skip func() bool) ([]jose.JSONWebKey, error) {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	s.mu.Lock()
	if skip() || (s.lastErr != nil && s.now().Sub(s.tried) < retryAfterFailure) {
		keys, err := s.keys, s.lastErr
		s.mu.Unlock()
		if len(keys) > 0 {
			return keys, nil
		}
		if err == nil {
			err = errors.New("key set is empty")
		}
		return nil, err
	}
	s.tried = s.now()
	s.mu.Unlock()

	keys, err := s.fetch(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	if err != nil {
		return nil, err
	}
	s.keys, s.fetched = keys, s.now()
	return keys, nil
}

func (s *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("key set cannot be fetched: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("key set cannot be fetched: HTTP %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("key set cannot be read: %w", err)
	}
	if len(body) > maxJWKSBytes {
		return nil, fmt.Errorf("key set is larger than %d bytes", maxJWKSBytes)
	}
	return parseJWKS(body)
}

// parseJWKS keeps the RSA signing keys of a key set and skips keys of other
// types, as the JWK Set specification asks.
func parseJWKS(body []byte) ([]jose.JSONWebKey, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("key set is not a JWK set: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, k := range raw.Keys {
		var jwk jose.JSONWebKey
		if json.Unmarshal(k, &jwk) != nil {
			continue
		}
		if _, ok := jwk.Key.(*rsa.PublicKey); !ok || (jwk.Use != "" && jwk.Use != "sig") {
			continue
		}
		if jwk.Algorithm != "" && jwk.Algorithm != string(jose.RS256) {
			continue
		}
		keys = append(keys, jwk)
	}
	if len(keys) == 0 {
		return nil, errors.New("key set has no RSA signing keys")
	}
	return keys, nil
}
