-- Messages that can never be processed because they have no usable identity.
--
-- Such a message is not an operation: there is no key to bind its
-- redeliveries to. It used to be refused and recorded nowhere, so Pub/Sub
-- sent it again until its retention ran out and nobody could see why. Each
-- one is now kept here once per route and fingerprint (a hash of the message,
-- never its body): a redelivery only raises count and last_seen, so the table
-- grows with distinct poison messages, not with deliveries, and the gateway
-- caps the rows per route (storage/poison.go).

-- +goose Up
CREATE TABLE poison_messages (
    route       text        NOT NULL,
    fingerprint text        NOT NULL,
    broker      text        NOT NULL,
    message_id  text        NOT NULL DEFAULT '' CHECK (length(message_id) <= 256),
    reason      text        NOT NULL CHECK (length(reason) <= 1024),
    count       bigint      NOT NULL DEFAULT 1 CHECK (count >= 1),
    first_seen  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL CHECK (last_seen >= first_seen),
    -- acked: the latest copy was acked once recorded (dead_letter: gateway).
    acked       boolean     NOT NULL,
    PRIMARY KEY (route, fingerprint)
);
-- Lists page on (first_seen, route, fingerprint), which a redelivery never
-- changes, so a page never loses or repeats a record.
CREATE INDEX poison_messages_first_seen ON poison_messages (first_seen, route, fingerprint);

-- +goose Down
DROP TABLE poison_messages;
