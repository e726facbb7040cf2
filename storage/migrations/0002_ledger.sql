-- The evidence ledger. It keeps references, fingerprints and outcomes, never
-- message bodies: what it holds is meant to be shown to an operator.

-- +goose Up

CREATE TABLE operations (
    id                  text PRIMARY KEY,
    scope_key           text NOT NULL,
    tenant              text NOT NULL,
    route               text NOT NULL,
    key_source          text NOT NULL,
    key                 text NOT NULL,
    fingerprint         text NOT NULL,
    fingerprint_version integer NOT NULL,
    -- Set on conflict records: the operation whose key they reused.
    conflict_of         text REFERENCES operations (id) ON DELETE CASCADE,
    state               ackgate_state NOT NULL,
    shape               text NOT NULL,
    dead_letter_policy  text NOT NULL,
    contract_version    text NOT NULL,
    idempotency_key     text NOT NULL,
    fence               bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    owner               text NOT NULL DEFAULT '',
    lease_start         timestamptz,
    lease_deadline      timestamptz,
    lease_extensions    integer NOT NULL DEFAULT 0,
    delivery_count      integer NOT NULL DEFAULT 0,
    attempt_count       integer NOT NULL DEFAULT 0,
    first_attempt_at    timestamptz,
    result_id           text NOT NULL DEFAULT '',
    evidence_at         timestamptz,
    acked_at            timestamptz,
    reason              text NOT NULL DEFAULT '',
    lane                text NOT NULL DEFAULT '',
    trace_id            text NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    retain_until        timestamptz NOT NULL,
    -- Only a conflict record may be conflicting, and a conflict record can never
    -- move on to be executed or acknowledged.
    CONSTRAINT conflict_records_stay_conflicting CHECK (
        CASE WHEN conflict_of IS NULL THEN state <> 'conflicting'
             ELSE state IN ('received', 'conflicting') END
    )
);

-- One operation per scope key; conflict records share their original's scope
-- key and are told apart by id (gate.ConflictID).
CREATE UNIQUE INDEX operations_scope_key ON operations (scope_key) WHERE conflict_of IS NULL;
CREATE INDEX operations_conflict_of ON operations (conflict_of) WHERE conflict_of IS NOT NULL;
-- Admin listing is keyset-paginated on (created_at, id), optionally by route or state.
CREATE INDEX operations_created ON operations (created_at, id);
CREATE INDEX operations_route_created ON operations (route, created_at, id);
CREATE INDEX operations_state_created ON operations (state, created_at, id);
CREATE INDEX operations_key ON operations (key);

-- Every push request, including redeliveries that changed nothing.
CREATE TABLE deliveries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id   text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    broker         text NOT NULL,
    source         text NOT NULL,
    message_id     text NOT NULL,
    broker_attempt integer NOT NULL DEFAULT 0,
    received_at    timestamptz NOT NULL,
    -- '' while the answer is not decided yet.
    decision       text NOT NULL CHECK (decision IN ('', 'ack', 'nack', 'reject')),
    reason         text NOT NULL DEFAULT '',
    anomaly        text NOT NULL DEFAULT '',
    trace_id       text NOT NULL DEFAULT ''
);

CREATE INDEX deliveries_operation ON deliveries (operation_id, id);
CREATE INDEX deliveries_message_id ON deliveries (message_id);

-- Every downstream call, written before it is made: an attempt with no outcome
-- is one whose result nobody lived to record.
CREATE TABLE attempts (
    operation_id    text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    n               integer NOT NULL CHECK (n > 0),
    kind            text NOT NULL CHECK (kind IN ('effect', 'lookup')),
    idempotency_key text NOT NULL,
    fence           bigint NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    outcome         text NOT NULL DEFAULT ''
        CHECK (outcome IN ('', 'confirmed', 'retryable', 'terminal', 'unknown', 'absent')),
    status_code     integer NOT NULL DEFAULT 0,
    result_id       text NOT NULL DEFAULT '',
    reason          text NOT NULL DEFAULT '',
    PRIMARY KEY (operation_id, n),
    CONSTRAINT finished_attempts_have_outcome CHECK ((finished_at IS NULL) = (outcome = ''))
);

-- The event log: one row per transition, in order. seq is assigned by the
-- ledger (see 0003), so callers cannot leave gaps or reorder history.
CREATE TABLE transitions (
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    seq          integer NOT NULL,
    from_state   ackgate_state,
    to_state     ackgate_state NOT NULL,
    at           timestamptz NOT NULL,
    fence        bigint NOT NULL,
    message_id   text NOT NULL DEFAULT '',
    reason       text NOT NULL DEFAULT '',
    PRIMARY KEY (operation_id, seq)
);

-- A message the gateway took out of circulation; at most once per operation.
CREATE TABLE dead_letters (
    operation_id text PRIMARY KEY REFERENCES operations (id) ON DELETE CASCADE,
    reason       text NOT NULL,
    at           timestamptz NOT NULL
);

-- +goose Down
DROP TABLE dead_letters;
DROP TABLE transitions;
DROP TABLE attempts;
DROP TABLE deliveries;
DROP TABLE operations;
