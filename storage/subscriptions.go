package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/ackgate/ackgate/adminapi"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Subscriptions is the Postgres log of SNS subscription messages.
type Subscriptions struct {
	pool *pgxpool.Pool
}

// NewSubscriptions uses pool for every call; the pool belongs to the caller.
func NewSubscriptions(pool *pgxpool.Pool) *Subscriptions { return &Subscriptions{pool: pool} }

const insertSubscriptionEventSQL = `
	INSERT INTO sns_subscription_events
		(route, topic_arn, message_type, message_id, outcome, reason, subscription_arn, received_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
	RETURNING id`

// Record appends e, one round trip and one commit, and sets e.ID.
func (s *Subscriptions) Record(ctx context.Context, e *adminapi.SubscriptionEvent) error {
	err := s.pool.QueryRow(ctx, insertSubscriptionEventSQL,
		e.Route, e.TopicArn, e.MessageType, e.MessageID, e.Outcome, e.Reason, e.SubscriptionArn, e.ReceivedAt,
	).Scan(&e.ID)
	return translate("record subscription event", err)
}

// Claim takes the right to act on one subscription message: the first copy
// of a (route, MessageId) gets it, later copies learn how it was settled, or
// that it is being handled. A claim left unsettled for longer than lease
// (its owner died) may be taken by the next copy. One round trip, two when
// the claim is someone else's.
func (s *Subscriptions) Claim(ctx context.Context, route, messageID string, lease time.Duration) (adminapi.SubscriptionClaim, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	c := adminapi.SubscriptionClaim{Route: route, MessageID: messageID, Owner: hex.EncodeToString(b[:])}
	err := s.pool.QueryRow(ctx, `
		INSERT INTO sns_subscription_claims AS c (route, message_id, owner) VALUES ($1, $2, $3)
		ON CONFLICT (route, message_id) DO UPDATE SET owner = excluded.owner, claimed_at = now()
			WHERE c.outcome IS NULL AND c.claimed_at < now() - make_interval(secs => $4)
		RETURNING true`, route, messageID, c.Owner, lease.Seconds()).Scan(&c.Owned)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return c, translate("claim subscription message", err)
	}
	var outcome *string
	err = s.pool.QueryRow(ctx, `
		SELECT outcome, reason FROM sns_subscription_claims WHERE route = $1 AND message_id = $2`,
		route, messageID).Scan(&outcome, &c.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		// Given up between the two statements: being handled, as far as
		// this copy can tell.
		return c, nil
	}
	if outcome != nil {
		c.Outcome = *outcome
	}
	return c, translate("read subscription claim", err)
}

// Settle records e, the outcome of the message c claimed, and settles the
// claim in the same transaction: a later copy is answered from it. A
// SubscriptionConfirmFailed outcome gives the claim up instead, so that the
// broker's retry can try again. If the claim was taken over meanwhile, e is
// still recorded (the event log keeps every attempt) and the claim is left
// to its new owner.
func (s *Subscriptions) Settle(ctx context.Context, c adminapi.SubscriptionClaim, e *adminapi.SubscriptionEvent) error {
	if !c.Owned {
		return errors.New("storage: settle subscription message: the claim is not owned")
	}
	return translate("settle subscription message", pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, insertSubscriptionEventSQL,
			e.Route, e.TopicArn, e.MessageType, e.MessageID, e.Outcome, e.Reason, e.SubscriptionArn, e.ReceivedAt,
		).Scan(&e.ID); err != nil {
			return err
		}
		var err error
		if e.Outcome == adminapi.SubscriptionConfirmFailed {
			_, err = tx.Exec(ctx, `
				DELETE FROM sns_subscription_claims
				WHERE route = $1 AND message_id = $2 AND owner = $3 AND outcome IS NULL`,
				c.Route, c.MessageID, c.Owner)
		} else {
			_, err = tx.Exec(ctx, `
				UPDATE sns_subscription_claims SET outcome = $4, reason = $5, event_id = $6
				WHERE route = $1 AND message_id = $2 AND owner = $3 AND outcome IS NULL`,
				c.Route, c.MessageID, c.Owner, e.Outcome, e.Reason, e.ID)
		}
		return err
	}))
}

// List returns a route's subscription events, oldest first.
func (s *Subscriptions) List(ctx context.Context, route string) ([]adminapi.SubscriptionEvent, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, route, topic_arn, message_type, message_id, outcome, reason, subscription_arn, received_at
		FROM sns_subscription_events WHERE route = $1 ORDER BY id`, route)
	if err != nil {
		return nil, translate("list subscription events", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (adminapi.SubscriptionEvent, error) {
		var e adminapi.SubscriptionEvent
		err := r.Scan(&e.ID, &e.Route, &e.TopicArn, &e.MessageType, &e.MessageID, &e.Outcome, &e.Reason,
			&e.SubscriptionArn, &e.ReceivedAt)
		return e, err
	})
	if err != nil {
		return nil, translate("list subscription events", err)
	}
	return out, nil
}
