package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ConsoleSessions keeps the operator console's sessions and login nonces in
// Redis, so that every replica sees a login, a logout and a used login form
// at once (console.SessionStore; the wiring asserts it). Keys are the
// console's, under ackgate:console:; values expire with their TTL.
type ConsoleSessions struct {
	c redis.UniversalClient
}

// NewConsoleSessions keeps console sessions in c.
func NewConsoleSessions(c redis.UniversalClient) *ConsoleSessions { return &ConsoleSessions{c: c} }

func consoleKey(key string) string { return "ackgate:console:" + key }

// Put keeps value under key for ttl.
func (s *ConsoleSessions) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := s.c.Set(ctx, consoleKey(key), value, ttl).Err(); err != nil {
		return fmt.Errorf("storage: console session: %w", err)
	}
	return nil
}

// Get returns the value under key.
func (s *ConsoleSessions) Get(ctx context.Context, key string) ([]byte, bool, error) {
	return s.read(s.c.Get(ctx, consoleKey(key)))
}

// Take returns the value under key and deletes it in one command (GETDEL),
// so that of two concurrent calls only one finds it.
func (s *ConsoleSessions) Take(ctx context.Context, key string) ([]byte, bool, error) {
	return s.read(s.c.GetDel(ctx, consoleKey(key)))
}

// Delete removes key.
func (s *ConsoleSessions) Delete(ctx context.Context, key string) error {
	if err := s.c.Del(ctx, consoleKey(key)).Err(); err != nil {
		return fmt.Errorf("storage: console session: %w", err)
	}
	return nil
}

func (s *ConsoleSessions) read(cmd *redis.StringCmd) ([]byte, bool, error) {
	b, err := cmd.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("storage: console session: %w", err)
	}
	return b, true, nil
}
