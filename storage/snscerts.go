package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// SNSCerts keeps genuine SNS signing certificates in Redis, each until it
// expires, so that every replica finds what one replica fetched: a
// restarted or new replica verifies SNS messages without a fetch of its
// own, and so cannot be kept from verifying by whoever spends its fetch
// budgets. It is the verifier's store (brokerauth.CertStore; the wiring
// asserts it). The key is a hash of the certificate URL; the value is the
// certificate's PEM, which the verifier parses again when it reads it.
type SNSCerts struct {
	c redis.UniversalClient
}

// NewSNSCerts keeps certificates in c.
func NewSNSCerts(c redis.UniversalClient) *SNSCerts { return &SNSCerts{c: c} }

// maxCertPEM bounds what is kept or read back: SNS's certificates are about
// 2 KB.
const maxCertPEM = 64 << 10

func snsCertKey(url string) string {
	sum := sha256.Sum256([]byte(url))
	return "ackgate:snscert:" + hex.EncodeToString(sum[:])
}

// Cert returns the PEM kept for url; found is false when there is none.
func (s *SNSCerts) Cert(ctx context.Context, url string) ([]byte, bool, error) {
	b, err := s.c.Get(ctx, snsCertKey(url)).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("storage: sns certificate: %w", err)
	case len(b) > maxCertPEM:
		return nil, false, nil
	}
	return b, true, nil
}

// PutCert keeps pem for url until until; a time already past keeps
// nothing.
func (s *SNSCerts) PutCert(ctx context.Context, url string, pem []byte, until time.Time) error {
	ttl := time.Until(until)
	if ttl <= 0 || len(pem) > maxCertPEM {
		return nil
	}
	if err := s.c.Set(ctx, snsCertKey(url), pem, ttl).Err(); err != nil {
		return fmt.Errorf("storage: sns certificate: %w", err)
	}
	return nil
}
