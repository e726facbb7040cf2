-- The handoff shape's outbox: the message a handoff route's relay delivers
-- after the broker was acked, committed in the same transaction as the
-- operation's intent.
--
-- The entry keeps the message only while the effect is not evidenced:
-- once the operation is confirmed its data and attributes are cleared, and
-- the entry goes with its operation at the retention purge. A terminal or
-- indeterminate operation keeps its message, because an operator's replay
-- or "did not happen" hands it to the relay once more.

-- +goose Up

-- When the operation committed with its outbox entry: the point its broker
-- was acked, before any effect.
ALTER TABLE operations ADD COLUMN handed_off_at timestamptz;

CREATE TABLE outbox (
    operation_id    text PRIMARY KEY REFERENCES operations (id) ON DELETE CASCADE,
    route           text NOT NULL,
    -- The idempotency key the relay sends: stable across every pass.
    publication_id  text NOT NULL,
    broker          text NOT NULL,
    source          text NOT NULL,
    message_id      text NOT NULL,
    publish_time    timestamptz,
    ordering_key    text NOT NULL DEFAULT '',
    -- The route's private attributes are never here.
    attributes      jsonb,
    data            bytea,
    created_at      timestamptz NOT NULL,
    -- When a relay may take the entry up: pushed ahead by each pass that
    -- claims it, so replicas polling at once never share an entry.
    next_attempt_at timestamptz NOT NULL,
    passes          integer NOT NULL DEFAULT 0 CHECK (passes >= 0),
    delivered_at    timestamptz,
    CHECK (delivered_at IS NULL OR (data IS NULL AND attributes IS NULL))
);

-- The relay's queue: entries not yet delivered, by when they are due.
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL;

-- +goose Down
DROP TABLE outbox;
ALTER TABLE operations DROP COLUMN handed_off_at;
