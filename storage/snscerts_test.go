package storage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/internal/authtest"
	"github.com/ackgate/ackgate/internal/testenv"
	"github.com/ackgate/ackgate/storage"
)

// A certificate one replica fetched is found by the others in Redis: a cold
// replica verifies without a fetch, even with the certificate host down or
// with its own fetch budget for that host spent by messages naming bogus
// certificates. It is kept until the certificate expires (at most a day).
func TestSNSCertsAreSharedBetweenReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	sns := authtest.NewSNS(t)
	store := storage.NewSNSCerts(rdb)
	replica := func(perHost int) *brokerauth.SNSVerifier {
		v, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{TrustedURLPrefixes: []string{sns.Prefix()}, CertFetchesPerHost: perHost})
		if err != nil {
			t.Fatal(err)
		}
		v.ShareCerts(store)
		return v
	}
	m := sns.Sign(sns.Notification("arn:aws:sns:us-east-1:123456789012:orders", "n-1", "hello"), "2")

	if err := replica(10).Verify(ctx, m); err != nil {
		t.Fatalf("first replica: %v", err)
	}
	if n := sns.CertHits(); n != 1 {
		t.Fatalf("first replica fetched %d times, want 1", n)
	}
	keys, err := rdb.Keys(ctx, "ackgate:snscert:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("shared certificates: %v %v", keys, err)
	}
	if ttl := rdb.TTL(ctx, keys[0]).Val(); ttl <= 0 || ttl > 24*time.Hour {
		t.Fatalf("shared for %s, want until the certificate expires, at most a day", ttl)
	}

	if err := replica(10).Verify(ctx, m); err != nil {
		t.Fatalf("a cold replica: %v", err)
	}
	// A cold replica whose budget for the host is spent on bogus
	// certificates, with the host gone: it still verifies the genuine one.
	starved := replica(2)
	for i := range 5 {
		bogus := sns.Sign(sns.Notification("arn:aws:sns:us-east-1:123456789012:orders", fmt.Sprint("b-", i), "x"), "2")
		bogus.SigningCertURL = fmt.Sprintf("%sbogus-%d.pem", sns.Prefix(), i)
		_ = starved.Verify(ctx, bogus)
	}
	sns.Stop()
	if err := starved.Verify(ctx, m); err != nil {
		t.Fatalf("a starved replica with the host down: %v", err)
	}
	if n := sns.CertHits(); n != 1+2 {
		t.Fatalf("certificate host hit %d times, want the first fetch and the starved replica's two bogus ones", n)
	}

	// What Redis holds is parsed again: garbage there is a miss, and the
	// replica fetches as it would without a store.
	if err := rdb.Set(ctx, keys[0], "not a certificate", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	sns.Start()
	if err := replica(10).Verify(ctx, m); err != nil {
		t.Fatalf("with garbage in the store: %v", err)
	}
	if n := sns.CertHits(); n != 4 {
		t.Fatalf("certificate host hit %d times, want one more fetch", n)
	}
}

// Past times keep nothing; a missing key is no error.
func TestSNSCertsStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	s := storage.NewSNSCerts(rdb)
	if _, found, err := s.Cert(ctx, "https://sns.us-east-1.amazonaws.com/x.pem"); found || err != nil {
		t.Fatalf("empty store: %v %v", found, err)
	}
	if err := s.PutCert(ctx, "u", []byte("pem"), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := s.Cert(ctx, "u"); found {
		t.Fatal("a certificate past its time was kept")
	}
	if err := s.PutCert(ctx, "u", []byte("pem"), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if b, found, err := s.Cert(ctx, "u"); !found || err != nil || string(b) != "pem" {
		t.Fatalf("kept: %q %v %v", b, found, err)
	}
}
