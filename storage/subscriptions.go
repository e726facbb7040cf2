package storage

import (
	"context"

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

// Record appends e, one round trip and one commit, and sets e.ID.
func (s *Subscriptions) Record(ctx context.Context, e *adminapi.SubscriptionEvent) error {
	err := s.pool.QueryRow(ctx, `
		INSERT INTO sns_subscription_events
			(route, topic_arn, message_type, message_id, outcome, reason, subscription_arn, received_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		RETURNING id`,
		e.Route, e.TopicArn, e.MessageType, e.MessageID, e.Outcome, e.Reason, e.SubscriptionArn, e.ReceivedAt,
	).Scan(&e.ID)
	return translate("record subscription event", err)
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
