-- SNS subscription messages and what the gateway did with each: the
-- confirmations it made (GET on the SubscribeURL) or refused (topic not
-- listed on the route), those it could not make yet, and unsubscribe
-- confirmations, which are recorded and never acted on. Append-only: SNS may
-- send a confirmation again, and every attempt is kept. URLs are not stored,
-- because a SubscribeURL carries the confirmation token.

-- +goose Up
CREATE TABLE sns_subscription_events (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route            text NOT NULL,
    topic_arn        text NOT NULL,
    message_type     text NOT NULL
        CHECK (message_type IN ('SubscriptionConfirmation', 'UnsubscribeConfirmation')),
    message_id       text NOT NULL,
    outcome          text NOT NULL
        CHECK (outcome IN ('confirmed', 'refused', 'confirm_failed', 'recorded')),
    reason           text NOT NULL DEFAULT '',
    subscription_arn text NOT NULL DEFAULT '',
    received_at      timestamptz NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX sns_subscription_events_route_topic ON sns_subscription_events (route, topic_arn, id);

-- +goose Down
DROP TABLE sns_subscription_events;
