-- One claim per SNS subscription message (route and MessageId), so a
-- captured confirmation replayed many times is confirmed once. A copy that
-- finds a settled claim is answered from it, without a new ConfirmSubscription
-- call and without a new event. A claim that is not settled belongs to the
-- copy handling it now; after its lease (claimed_at) has passed, the owner is
-- taken to have died and another copy may take it. A confirmation that could
-- not be made now gives its claim up, so SNS's retry of the same MessageId
-- tries again.

-- +goose Up
CREATE TABLE sns_subscription_claims (
    route      text NOT NULL,
    message_id text NOT NULL,
    owner      text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    -- Set once settled; NULL while a copy is being handled.
    outcome    text CHECK (outcome IN ('confirmed', 'refused', 'recorded')),
    reason     text NOT NULL DEFAULT '',
    event_id   bigint REFERENCES sns_subscription_events (id),
    PRIMARY KEY (route, message_id),
    CHECK ((outcome IS NULL) = (event_id IS NULL))
);

-- Messages already handled before this migration count as settled.
INSERT INTO sns_subscription_claims (route, message_id, owner, claimed_at, outcome, reason, event_id)
SELECT DISTINCT ON (route, message_id) route, message_id, 'migration', received_at, outcome, reason, id
FROM sns_subscription_events
WHERE outcome IN ('confirmed', 'refused', 'recorded')
ORDER BY route, message_id, id;

-- +goose Down
DROP TABLE sns_subscription_claims;
