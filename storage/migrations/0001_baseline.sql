-- The baseline: the ledger as it stood when the migrations were folded into
-- one. schema.sql states the ledger as it is now; the migrations after this
-- one are the deltas from it, and TestSchemaFileIsTheMigratedSchema holds
-- the two together. A ledger from before the baseline is drained or
-- recreated (README, "Upgrading").

-- +goose Up
-- +goose StatementBegin
-- The nine evidence states (gate/state.go).
CREATE DOMAIN ackgate_state AS text
    CHECK (VALUE IN ('received', 'conflicting', 'reserved', 'pending_effect', 'effect_indeterminate',
                     'effect_confirmed', 'ack_pending', 'acknowledged', 'terminal_failure'));

-- One row per operation, and per conflict record (conflict_of set).
--
-- Columns are ordered for the WAL: an UPDATE that stays on its page logs
-- only the bytes between the longest unchanged prefix and suffix, so what
-- the evidence and the ack mark change sits together at the end.
CREATE TABLE operations (
    -- Time order: listings and the retention purge walk it.
    seq                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at          timestamptz NOT NULL,
    retain_until        timestamptz NOT NULL,
    publish_time        timestamptz,
    fingerprint_version integer NOT NULL,
    broker_attempt      integer NOT NULL DEFAULT 0,
    -- Derived from the scope key (gate/identity.go), so the id is the
    -- operation's unique key; a conflict record's is derived from the scope
    -- key and its fingerprint.
    id                  text NOT NULL UNIQUE,
    route               text NOT NULL,
    tenant              text NOT NULL,
    key_source          text NOT NULL,
    key                 text NOT NULL,
    scope_key           text NOT NULL,
    fingerprint         text NOT NULL,
    conflict_of         text,
    shape               text NOT NULL,
    dead_letter_policy  text NOT NULL,
    contract_version    text NOT NULL,
    idempotency_key     text NOT NULL,
    -- The first delivery's: the operation's trace whoever writes later.
    trace_id            text NOT NULL DEFAULT '',
    span_id             text NOT NULL DEFAULT '',
    -- The first delivery (the further ones are in deliveries).
    broker              text NOT NULL,
    source              text NOT NULL,
    message_id          text NOT NULL,

    -- Written off the common path: a new owner, the recovery lanes.
    fence               bigint NOT NULL CHECK (fence >= 0),
    owner               text NOT NULL DEFAULT '',
    lease_start         timestamptz,
    log_count           integer NOT NULL DEFAULT 0 CHECK (log_count >= 0),
    -- Set when the operation leaves the common path; the lanes' index holds
    -- only such rows.
    waiting             text,
    lane                text NOT NULL DEFAULT '',
    grant_through       integer NOT NULL DEFAULT 0 CHECK (grant_through >= 0),
    next_check_at       timestamptz,
    checks              integer NOT NULL DEFAULT 0 CHECK (checks >= 0),
    handed_off_at       timestamptz,
    delivery_count      integer NOT NULL DEFAULT 1 CHECK (delivery_count >= 1),
    attempt_count       integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    -- The first attempt (the further ones, and every lookup, are in
    -- attempts). It is always an effect call.
    a1_fence            bigint,
    a1_contract         text,
    a1_started_at       timestamptz,

    -- Written by the evidence.
    lease_deadline      timestamptz,
    lease_extensions    integer NOT NULL DEFAULT 0 CHECK (lease_extensions >= 0),
    lease_lost_at       timestamptz,
    a1_finished_at      timestamptz,
    a1_outcome          text NOT NULL DEFAULT ''
        CHECK (a1_outcome IN ('', 'confirmed', 'retryable', 'terminal', 'unknown')),
    a1_status           integer NOT NULL DEFAULT 0,
    a1_result_id        text NOT NULL DEFAULT '',
    a1_reason           text NOT NULL DEFAULT '',
    d1_decision         text NOT NULL DEFAULT '' CHECK (d1_decision IN ('', 'ack', 'nack', 'reject')),
    d1_reason           text NOT NULL DEFAULT '',
    d1_anomaly          text NOT NULL DEFAULT '',
    reason              text NOT NULL DEFAULT '',
    result_id           text NOT NULL DEFAULT '',
    evidence_at         timestamptz,
    -- Written by every change, the ack mark included.
    state               ackgate_state NOT NULL,
    acked_at            timestamptz,
    updated_at          timestamptz NOT NULL,

    -- A conflict record is never executed: it is conflicting from birth.
    CONSTRAINT conflict_records_stay_conflicting CHECK ((conflict_of IS NULL) = (state <> 'conflicting')),
    -- Evidence is what makes a state confirmed, and the ack mark what makes
    -- it acknowledged.
    CONSTRAINT confirmed_states_have_evidence
        CHECK ((state IN ('effect_confirmed', 'ack_pending', 'acknowledged')) = (evidence_at IS NOT NULL)),
    CONSTRAINT acknowledged_has_its_ack CHECK ((state = 'acknowledged') = (acked_at IS NOT NULL)),
    -- An operation in a lane is in the lanes' index under that lane; open
    -- work enters it as 'open' once it leaves the common path; acknowledged
    -- work has left every lane.
    CONSTRAINT waiting_follows_state CHECK (CASE
        WHEN state IN ('effect_indeterminate', 'terminal_failure', 'conflicting') THEN waiting = state
        WHEN state = 'acknowledged' THEN waiting IS NULL
        ELSE waiting IS NULL OR waiting = 'open' END),
    CONSTRAINT first_attempt_is_whole CHECK (
        (attempt_count = 0) = (a1_started_at IS NULL)
        AND (a1_started_at IS NULL) = (a1_fence IS NULL)
        AND (a1_finished_at IS NULL) = (a1_outcome = ''))
) WITH (fillfactor = 60);

-- The lanes: indeterminate, terminal and conflicting operations, and open
-- work that left the common path. Nothing on the common path enters it.
CREATE INDEX operations_lanes ON operations (waiting, route, seq) WHERE waiting IS NOT NULL;
-- A conflict record by the operation whose key it reused.
CREATE INDEX operations_conflict_of ON operations (conflict_of) WHERE conflict_of IS NOT NULL;
-- "What happened to message X?" for routes keyed on something else than
-- the message id (on the others the id is derived from the message id).
CREATE INDEX operations_message_id ON operations (message_id) WHERE key_source <> 'message_id';

-- Refuses what a trigger's WHEN clause found wrong: TG_ARGV[0] is the
-- SQLSTATE, TG_ARGV[1] what was refused. It runs only then.
CREATE FUNCTION ackgate_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%: % refused: %', TG_TABLE_NAME, TG_OP, TG_ARGV[1] USING ERRCODE = TG_ARGV[0];
END
$$;

-- Raises message; the named queries call it, in a branch a correct write
-- never takes, to refuse a change they cannot express as a WHERE clause.
CREATE FUNCTION ackgate_refused(message text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', message USING ERRCODE = 'AG020';
END
$$;

-- An operation is born where a delivery's creating claim (or a conflict)
-- leaves it, with no history yet and the first fence the ledger gives.
CREATE TRIGGER operations_begin BEFORE INSERT ON operations FOR EACH ROW
    WHEN (NOT (NEW.log_count = 0 AND NEW.evidence_at IS NULL AND NEW.acked_at IS NULL AND (
        (NEW.conflict_of IS NULL AND NEW.fence = 1 AND NEW.state IN ('pending_effect', 'terminal_failure'))
        OR (NEW.conflict_of IS NOT NULL AND NEW.fence = 0 AND NEW.state = 'conflicting'))))
    EXECUTE FUNCTION ackgate_refuse('AG001', 'an operation begins in pending_effect or terminal_failure under fence 1, a conflict record in conflicting');

-- An operation's identity and first delivery are fixed. Like the fence's
-- guard below, the trigger fires only for a statement that sets one of its
-- columns: the ledger's own statements never set these, so they do not pay
-- for the check, and any other writer that does is checked.
CREATE TRIGGER operations_identity_fixed BEFORE UPDATE OF seq, id, created_at, route, tenant, key_source, key,
        scope_key, fingerprint, fingerprint_version, conflict_of, shape, idempotency_key, trace_id, broker, source,
        message_id, broker_attempt, publish_time ON operations FOR EACH ROW
    WHEN ((NEW.seq, NEW.id, NEW.created_at, NEW.route, NEW.tenant, NEW.key_source, NEW.key, NEW.scope_key,
           NEW.fingerprint, NEW.fingerprint_version, NEW.conflict_of, NEW.shape, NEW.idempotency_key,
           NEW.trace_id, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt, NEW.publish_time)
          IS DISTINCT FROM
          (OLD.seq, OLD.id, OLD.created_at, OLD.route, OLD.tenant, OLD.key_source, OLD.key, OLD.scope_key,
           OLD.fingerprint, OLD.fingerprint_version, OLD.conflict_of, OLD.shape, OLD.idempotency_key,
           OLD.trace_id, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt, OLD.publish_time))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'an operation''s identity and first delivery are fixed');

-- A fence only rises, and a new owner is a change off the common path,
-- which the log keeps.
CREATE TRIGGER operations_fence_rises BEFORE UPDATE OF fence, log_count, delivery_count, attempt_count
        ON operations FOR EACH ROW
    WHEN (NEW.fence < OLD.fence OR (NEW.fence <> OLD.fence AND NEW.log_count = 0)
          OR NEW.log_count < OLD.log_count OR NEW.delivery_count < OLD.delivery_count
          OR NEW.attempt_count < OLD.attempt_count)
    EXECUTE FUNCTION ackgate_refuse('AG002', 'fences and counts only rise, and a new fence is logged');

-- Evidence, the ack, the first delivery's answer and the first attempt's
-- end are each written once.
CREATE TRIGGER operations_history_kept BEFORE UPDATE ON operations FOR EACH ROW
    WHEN ((OLD.evidence_at IS NOT NULL AND (NEW.evidence_at, NEW.result_id) IS DISTINCT FROM (OLD.evidence_at, OLD.result_id))
          OR (OLD.acked_at IS NOT NULL AND NEW.acked_at IS DISTINCT FROM OLD.acked_at)
          OR (OLD.d1_decision <> '' AND (NEW.d1_decision, NEW.d1_reason, NEW.d1_anomaly)
              IS DISTINCT FROM (OLD.d1_decision, OLD.d1_reason, OLD.d1_anomaly))
          OR (OLD.a1_started_at IS NOT NULL AND (NEW.a1_fence, NEW.a1_contract, NEW.a1_started_at)
              IS DISTINCT FROM (OLD.a1_fence, OLD.a1_contract, OLD.a1_started_at))
          OR (OLD.a1_finished_at IS NOT NULL AND (NEW.a1_finished_at, NEW.a1_outcome, NEW.a1_status, NEW.a1_result_id, NEW.a1_reason)
              IS DISTINCT FROM (OLD.a1_finished_at, OLD.a1_outcome, OLD.a1_status, OLD.a1_result_id, OLD.a1_reason)))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'evidence, the ack, the first delivery''s answer and the first attempt are written once');

-- The state moves only along the lifecycle (gate/state.go). A statement
-- may take more than one edge only along the paths the gate writes, each
-- with the witness of the state it passes: to ack_pending through
-- effect_confirmed from reserved or pending_effect, recording the evidence;
-- to acknowledged through ack_pending from effect_confirmed, recording the
-- ack, or from effect_indeterminate (a handed-off operation a lookup
-- settled), recording both.
CREATE TRIGGER operations_transitions_follow_the_table BEFORE UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state <> OLD.state AND NOT (
        (OLD.state, NEW.state) IN (
            ('received', 'reserved'), ('received', 'conflicting'), ('received', 'terminal_failure'),
            ('reserved', 'pending_effect'), ('reserved', 'effect_confirmed'),
            ('reserved', 'effect_indeterminate'), ('reserved', 'terminal_failure'),
            ('pending_effect', 'reserved'), ('pending_effect', 'effect_confirmed'),
            ('pending_effect', 'effect_indeterminate'), ('pending_effect', 'terminal_failure'),
            ('effect_indeterminate', 'pending_effect'), ('effect_indeterminate', 'effect_confirmed'),
            ('effect_indeterminate', 'terminal_failure'),
            ('effect_confirmed', 'ack_pending'), ('ack_pending', 'acknowledged'),
            ('terminal_failure', 'pending_effect'), ('terminal_failure', 'effect_confirmed'))
        OR (OLD.state IN ('reserved', 'pending_effect') AND NEW.state = 'ack_pending'
            AND OLD.evidence_at IS NULL AND NEW.evidence_at IS NOT NULL)
        OR (OLD.state = 'effect_confirmed' AND NEW.state = 'acknowledged'
            AND OLD.acked_at IS NULL AND NEW.acked_at IS NOT NULL)
        OR (OLD.state = 'effect_indeterminate' AND NEW.state = 'acknowledged'
            AND OLD.evidence_at IS NULL AND NEW.evidence_at IS NOT NULL AND OLD.acked_at IS NULL AND NEW.acked_at IS NOT NULL)))
    EXECUTE FUNCTION ackgate_refuse('AG001', 'the transition is not in the lifecycle');

-- Without a log an operation moves only along the common path (its
-- evidence, then its ack); any other move, and every move of an operation
-- that has a log, appends to the log in the same statement.
CREATE TRIGGER operations_state_moves_with_its_log BEFORE UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state <> OLD.state AND NEW.log_count = OLD.log_count AND NOT (OLD.log_count = 0 AND (
        (OLD.state = 'pending_effect' AND NEW.state = 'ack_pending')
        OR (OLD.state = 'ack_pending' AND NEW.state = 'acknowledged'))))
    EXECUTE FUNCTION ackgate_refuse('AG004', 'a move off the common path is logged');

-- Evidence goes only when its retention has run out.
CREATE TRIGGER operations_retained BEFORE DELETE ON operations FOR EACH ROW
    WHEN (OLD.retain_until > now())
    EXECUTE FUNCTION ackgate_refuse('AG003', 'the operation is still retained');

-- Side rows are history: appended, and deleted only with their operation
-- (the retention purge's cascade). The check is a query, but side rows are
-- off the common path.
CREATE FUNCTION ackgate_side_row_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM operations WHERE id = OLD.operation_id) THEN
        RAISE EXCEPTION '%: a side row goes only with its operation', TG_TABLE_NAME USING ERRCODE = 'AG003';
    END IF;
    RETURN OLD;
END
$$;

-- A delivery after the first: a redelivery, a contender, a late copy.
CREATE TABLE deliveries (
    operation_id   text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    n              integer NOT NULL CHECK (n > 1),
    broker         text NOT NULL,
    source         text NOT NULL,
    message_id     text NOT NULL,
    broker_attempt integer NOT NULL DEFAULT 0,
    received_at    timestamptz NOT NULL,
    publish_time   timestamptz,
    trace_id       text NOT NULL DEFAULT '',
    -- The state the delivery found the operation in.
    found          ackgate_state NOT NULL,
    -- The fence it took the lease with; 0 when it took none.
    fence          bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    decision       text NOT NULL DEFAULT '' CHECK (decision IN ('', 'ack', 'nack', 'reject')),
    reason         text NOT NULL DEFAULT '',
    anomaly        text NOT NULL DEFAULT '',
    PRIMARY KEY (operation_id, n)
);
CREATE INDEX deliveries_message_id ON deliveries (message_id);

CREATE TRIGGER deliveries_answered_once BEFORE UPDATE ON deliveries FOR EACH ROW
    WHEN ((NEW.operation_id, NEW.n, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt,
           NEW.received_at, NEW.publish_time, NEW.trace_id, NEW.found)
          IS DISTINCT FROM
          (OLD.operation_id, OLD.n, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt,
           OLD.received_at, OLD.publish_time, OLD.trace_id, OLD.found)
          OR (OLD.decision <> '' AND (NEW.decision, NEW.reason, NEW.anomaly) IS DISTINCT FROM (OLD.decision, OLD.reason, OLD.anomaly))
          OR (OLD.fence <> 0 AND NEW.fence <> OLD.fence))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'a delivery is answered once and marked with one fence');
CREATE TRIGGER deliveries_kept BEFORE DELETE ON deliveries FOR EACH ROW EXECUTE FUNCTION ackgate_side_row_deleted();

-- An attempt after the first, and every lookup of the effect.
CREATE TABLE attempts (
    operation_id     text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    n                integer NOT NULL CHECK (n > 1),
    kind             text NOT NULL CHECK (kind IN ('effect', 'lookup')),
    fence            bigint NOT NULL,
    contract_version text NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    outcome          text NOT NULL DEFAULT '' CHECK (outcome IN ('', 'confirmed', 'retryable', 'terminal', 'unknown', 'absent')),
    status_code      integer NOT NULL DEFAULT 0,
    result_id        text NOT NULL DEFAULT '',
    reason           text NOT NULL DEFAULT '',
    PRIMARY KEY (operation_id, n),
    CONSTRAINT finished_attempts_have_outcome CHECK ((finished_at IS NULL) = (outcome = ''))
);

CREATE TRIGGER attempts_finished_once BEFORE UPDATE ON attempts FOR EACH ROW
    WHEN ((NEW.operation_id, NEW.n, NEW.kind, NEW.fence, NEW.contract_version, NEW.started_at)
          IS DISTINCT FROM (OLD.operation_id, OLD.n, OLD.kind, OLD.fence, OLD.contract_version, OLD.started_at)
          OR OLD.finished_at IS NOT NULL)
    EXECUTE FUNCTION ackgate_refuse('AG003', 'an attempt is finished once');
CREATE TRIGGER attempts_kept BEFORE DELETE ON attempts FOR EACH ROW EXECUTE FUNCTION ackgate_side_row_deleted();

-- The log of an operation that left the common path: every step from then
-- on, numbered from 1 by the operation's log_count.
CREATE TABLE transitions (
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    seq          integer NOT NULL CHECK (seq > 0),
    from_state   ackgate_state NOT NULL,
    to_state     ackgate_state NOT NULL,
    at           timestamptz NOT NULL,
    fence        bigint NOT NULL,
    message_id   text NOT NULL DEFAULT '',
    reason       text NOT NULL DEFAULT '',
    PRIMARY KEY (operation_id, seq)
);

-- Every time the gateway took the message out of circulation.
CREATE TABLE dead_letters (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    reason       text NOT NULL,
    at           timestamptz NOT NULL
);
CREATE INDEX dead_letters_operation ON dead_letters (operation_id, id);

-- Operators' resolutions: who, why, and what each changed under which fence.
CREATE TABLE interventions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    kind         text NOT NULL CHECK (kind IN ('happened', 'not_happened', 'abandon', 'replay')),
    actor        text NOT NULL CHECK (actor <> '' AND length(actor) <= 256),
    reason       text NOT NULL CHECK (reason <> ''),
    result_id    text NOT NULL DEFAULT '',
    from_state   ackgate_state NOT NULL,
    to_state     ackgate_state NOT NULL,
    fence        bigint NOT NULL,
    at           timestamptz NOT NULL,
    CHECK ((kind = 'happened') = (result_id <> ''))
);
CREATE INDEX interventions_operation ON interventions (operation_id, id);

-- What happened to leases apart from the effect: an owner that found its
-- lease gone during its call, a reservation store that had lost the
-- operation's fencing counter.
CREATE TABLE lease_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    kind         text NOT NULL CHECK (kind IN ('lost', 'reset')),
    fence        bigint NOT NULL,
    at           timestamptz NOT NULL
);
CREATE INDEX lease_events_operation ON lease_events (operation_id, id);

-- Each logged step is an edge of the lifecycle (its order is the writer's:
-- checking that would take a query).
CREATE TRIGGER transitions_follow_the_table BEFORE INSERT ON transitions FOR EACH ROW
    WHEN (NOT (NEW.from_state, NEW.to_state) IN (
        ('received', 'reserved'), ('received', 'conflicting'), ('received', 'terminal_failure'),
        ('reserved', 'pending_effect'), ('reserved', 'effect_confirmed'),
        ('reserved', 'effect_indeterminate'), ('reserved', 'terminal_failure'),
        ('pending_effect', 'reserved'), ('pending_effect', 'effect_confirmed'),
        ('pending_effect', 'effect_indeterminate'), ('pending_effect', 'terminal_failure'),
        ('effect_indeterminate', 'pending_effect'), ('effect_indeterminate', 'effect_confirmed'),
        ('effect_indeterminate', 'terminal_failure'),
        ('effect_confirmed', 'ack_pending'), ('ack_pending', 'acknowledged'),
        ('terminal_failure', 'pending_effect'), ('terminal_failure', 'effect_confirmed')))
    EXECUTE FUNCTION ackgate_refuse('AG001', 'a logged step is not in the lifecycle');
CREATE TRIGGER transitions_append_only BEFORE UPDATE ON transitions FOR EACH ROW
    EXECUTE FUNCTION ackgate_refuse('AG003', 'the log is append-only');
CREATE TRIGGER transitions_kept BEFORE DELETE ON transitions FOR EACH ROW EXECUTE FUNCTION ackgate_side_row_deleted();
CREATE TRIGGER dead_letters_append_only BEFORE UPDATE ON dead_letters FOR EACH ROW
    EXECUTE FUNCTION ackgate_refuse('AG003', 'dead letters are append-only');
CREATE TRIGGER dead_letters_kept BEFORE DELETE ON dead_letters FOR EACH ROW EXECUTE FUNCTION ackgate_side_row_deleted();
CREATE TRIGGER interventions_append_only BEFORE UPDATE ON interventions FOR EACH ROW
    EXECUTE FUNCTION ackgate_refuse('AG003', 'interventions are append-only');
CREATE TRIGGER interventions_kept BEFORE DELETE ON interventions FOR EACH ROW EXECUTE FUNCTION ackgate_side_row_deleted();
CREATE TRIGGER lease_events_append_only BEFORE UPDATE ON lease_events FOR EACH ROW
    EXECUTE FUNCTION ackgate_refuse('AG003', 'lease events are append-only');
CREATE TRIGGER lease_events_kept BEFORE DELETE ON lease_events FOR EACH ROW EXECUTE FUNCTION ackgate_side_row_deleted();

-- Open work that outlived every owner's bound enters the lanes (waiting =
-- 'open') by a sweep that reads each row once, in seq order: marks says
-- which seq the ledger had reached when, cursor how far the sweep got.
CREATE TABLE sweep_marks (
    at  timestamptz PRIMARY KEY,
    seq bigint NOT NULL
);
CREATE TABLE sweep_cursor (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq bigint NOT NULL
);
INSERT INTO sweep_cursor (seq) VALUES (0);

-- A handoff route's outbox: the message its relay delivers after the
-- broker was acked, committed with the operation. It keeps the message only
-- while the effect is not evidenced; a terminal or indeterminate
-- operation's entry keeps it for an operator's replay.
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
    -- The id of the key data's private values were sealed with, and their
    -- JSON pointers ([]: the whole of data, which is not JSON); both NULL
    -- when the route lists none and data is kept as the broker sent it.
    sealed_with     text,
    sealed_pointers jsonb,
    created_at      timestamptz NOT NULL,
    -- When a relay may take the entry up: pushed ahead by each pass that
    -- claims it, so replicas polling at once never share an entry.
    next_attempt_at timestamptz NOT NULL,
    passes          integer NOT NULL DEFAULT 0 CHECK (passes >= 0),
    delivered_at    timestamptz,
    CHECK (delivered_at IS NULL OR (data IS NULL AND attributes IS NULL)),
    CHECK ((sealed_with IS NULL) = (sealed_pointers IS NULL))
);
-- The relay's queue: entries not yet delivered, by when they are due.
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL;

-- Messages that can never be processed because they have no usable
-- identity: kept once per route and fingerprint (a hash, never the body);
-- a redelivery raises count and last_seen (storage/poison.go caps the rows
-- per route).
CREATE TABLE poison_messages (
    route       text        NOT NULL,
    fingerprint text        NOT NULL,
    broker      text        NOT NULL,
    message_id  text        NOT NULL DEFAULT '' CHECK (length(message_id) <= 256),
    reason      text        NOT NULL CHECK (length(reason) <= 1024),
    count       bigint      NOT NULL DEFAULT 1 CHECK (count >= 1),
    first_seen  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL CHECK (last_seen >= first_seen),
    -- The latest copy was acked once recorded (dead_letter: gateway).
    acked       boolean     NOT NULL,
    PRIMARY KEY (route, fingerprint)
);
-- Pages on (first_seen, route, fingerprint), which a redelivery never
-- changes, so a page never loses or repeats a record.
CREATE INDEX poison_messages_first_seen ON poison_messages (first_seen, route, fingerprint);

-- SNS subscription messages and what the gateway did with each, append-only;
-- SubscribeURLs are not stored (they carry the confirmation token).
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

-- One claim per SNS subscription message, so a confirmation replayed many
-- times is confirmed once; an unsettled claim past its lease may be taken.
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

-- +goose StatementEnd

-- +goose Down
DROP TABLE sns_subscription_claims, sns_subscription_events, poison_messages, outbox, sweep_cursor,
    sweep_marks, lease_events, interventions, dead_letters, transitions, attempts, deliveries, operations;
DROP FUNCTION ackgate_side_row_deleted(), ackgate_refused(text), ackgate_refuse();
DROP DOMAIN ackgate_state;
