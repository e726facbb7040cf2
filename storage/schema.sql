-- The ledger as it is today: every table, constraint, index and function,
-- then the named queries the gateway runs against them (storage/queries.go
-- loads the section after the first "-- name:" line). A freshly migrated
-- database holds exactly this DDL (TestSchemaFileIsTheMigratedSchema).
--
-- The shape in one paragraph. An operation is one row of operations. The
-- common path (one delivery, one attempt, confirmed, acked) writes that row
-- three times and nothing else: the claim INSERTs it, the evidence and the
-- ack mark UPDATE it, each statement guarded by its WHERE clause (id, fence,
-- expected state), and the updates stay HOT because none of the columns
-- they change is indexed. What happens off that path is appended to side
-- tables when it happens: further deliveries and attempts, every lookup,
-- the transition log of an operation that left the path, lease losses and
-- resets, operators' interventions, every dead-lettering. Triggers guard
-- the row against other writers; their WHEN clauses compare OLD and NEW
-- only, so on a legal write no trigger function runs and no query is made.
-- The guards of updates run AFTER the write: Postgres locks a row (and logs
-- the lock) before any BEFORE UPDATE row trigger, whatever its WHEN says.

-- The nine evidence states (gate/state.go).
CREATE DOMAIN ackgate_state AS text
    CHECK (VALUE IN ('received', 'conflicting', 'reserved', 'pending_effect', 'effect_indeterminate',
                     'effect_confirmed', 'ack_pending', 'acknowledged', 'terminal_failure'));

-- The rules of one column of operations. Postgres prepares a domain's rule
-- once per session and checks it only where a statement assigns the
-- column, while it prepares every CHECK constraint of a table again for
-- each statement that writes the table: CHECK constraints are kept for
-- rules across columns.
CREATE DOMAIN ackgate_count AS integer CHECK (VALUE >= 0);
CREATE DOMAIN ackgate_fence AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN ackgate_deliveries AS integer CHECK (VALUE >= 1);
CREATE DOMAIN ackgate_outcome AS text CHECK (VALUE IN ('', 'confirmed', 'retryable', 'terminal', 'unknown'));
CREATE DOMAIN ackgate_decision AS text CHECK (VALUE IN ('', 'ack', 'nack', 'reject'));

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
    fence               ackgate_fence NOT NULL,
    owner               text NOT NULL DEFAULT '',
    lease_start         timestamptz,
    log_count           ackgate_count NOT NULL DEFAULT 0,
    -- Set when the operation leaves the common path; the lanes' index holds
    -- only such rows.
    waiting             text,
    lane                text NOT NULL DEFAULT '',
    grant_through       ackgate_count NOT NULL DEFAULT 0,
    next_check_at       timestamptz,
    checks              ackgate_count NOT NULL DEFAULT 0,
    handed_off_at       timestamptz,
    delivery_count      ackgate_deliveries NOT NULL DEFAULT 1,
    attempt_count       ackgate_count NOT NULL DEFAULT 0,
    -- The first attempt (the further ones, and every lookup, are in
    -- attempts). It is always an effect call.
    a1_fence            bigint,
    a1_contract         text,
    a1_started_at       timestamptz,

    -- Written by the evidence.
    lease_deadline      timestamptz,
    lease_extensions    ackgate_count NOT NULL DEFAULT 0,
    lease_lost_at       timestamptz,
    a1_finished_at      timestamptz,
    a1_outcome          ackgate_outcome NOT NULL DEFAULT '',
    a1_status           integer NOT NULL DEFAULT 0,
    a1_result_id        text NOT NULL DEFAULT '',
    a1_reason           text NOT NULL DEFAULT '',
    d1_decision         ackgate_decision NOT NULL DEFAULT '',
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
CREATE TRIGGER operations_identity_fixed AFTER UPDATE OF seq, id, created_at, route, tenant, key_source, key,
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
CREATE TRIGGER operations_fence_rises AFTER UPDATE OF fence, log_count, delivery_count, attempt_count
        ON operations FOR EACH ROW
    WHEN (NEW.fence < OLD.fence OR (NEW.fence <> OLD.fence AND NEW.log_count = 0)
          OR NEW.log_count < OLD.log_count OR NEW.delivery_count < OLD.delivery_count
          OR NEW.attempt_count < OLD.attempt_count)
    EXECUTE FUNCTION ackgate_refuse('AG002', 'fences and counts only rise, and a new fence is logged');

-- The first attempt's start is written once. Only the change statement
-- sets these columns; the evidence and the ack mark do not pay for the check.
CREATE TRIGGER operations_first_attempt_kept AFTER UPDATE OF a1_fence, a1_contract, a1_started_at
        ON operations FOR EACH ROW
    WHEN (OLD.a1_started_at IS NOT NULL AND (NEW.a1_fence, NEW.a1_contract, NEW.a1_started_at)
          IS DISTINCT FROM (OLD.a1_fence, OLD.a1_contract, OLD.a1_started_at))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'the first attempt''s start is written once');

-- Evidence, the ack, the first delivery's answer and the first attempt's
-- end are each written once.
CREATE TRIGGER operations_history_kept AFTER UPDATE ON operations FOR EACH ROW
    WHEN ((OLD.evidence_at IS NOT NULL AND (NEW.evidence_at, NEW.result_id) IS DISTINCT FROM (OLD.evidence_at, OLD.result_id))
          OR (OLD.acked_at IS NOT NULL AND NEW.acked_at IS DISTINCT FROM OLD.acked_at)
          OR (OLD.d1_decision <> '' AND (NEW.d1_decision, NEW.d1_reason, NEW.d1_anomaly)
              IS DISTINCT FROM (OLD.d1_decision, OLD.d1_reason, OLD.d1_anomaly))
          OR (OLD.a1_finished_at IS NOT NULL AND (NEW.a1_finished_at, NEW.a1_outcome, NEW.a1_status, NEW.a1_result_id, NEW.a1_reason)
              IS DISTINCT FROM (OLD.a1_finished_at, OLD.a1_outcome, OLD.a1_status, OLD.a1_result_id, OLD.a1_reason)))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'evidence, the ack, the first delivery''s answer and the first attempt''s end are written once');

-- The state moves only along the lifecycle (gate/state.go). A statement
-- may take more than one edge only along the paths the gate writes, listed
-- here as edges of their own: to ack_pending through effect_confirmed from
-- reserved or pending_effect, to acknowledged through ack_pending from
-- effect_confirmed, or from effect_indeterminate (a handed-off operation a
-- lookup settled). Each such move writes the evidence or the ack it passes
-- through; the two CHECK constraints on them refuse it otherwise, so the
-- clause need not say so again (it is prepared anew for every statement
-- that sets state).
CREATE TRIGGER operations_transitions_follow_the_table AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state <> OLD.state AND NOT (OLD.state || '>' || NEW.state = ANY ('{
        received>reserved, received>conflicting, received>terminal_failure,
        reserved>pending_effect, reserved>effect_confirmed, reserved>effect_indeterminate,
        reserved>terminal_failure, reserved>ack_pending,
        pending_effect>reserved, pending_effect>effect_confirmed, pending_effect>effect_indeterminate,
        pending_effect>terminal_failure, pending_effect>ack_pending,
        effect_indeterminate>pending_effect, effect_indeterminate>effect_confirmed,
        effect_indeterminate>terminal_failure, effect_indeterminate>acknowledged,
        effect_confirmed>ack_pending, effect_confirmed>acknowledged, ack_pending>acknowledged,
        terminal_failure>pending_effect, terminal_failure>effect_confirmed}'::text[])))
    EXECUTE FUNCTION ackgate_refuse('AG001', 'the transition is not in the lifecycle');

-- Without a log an operation moves only along the common path (its
-- evidence, then its ack); any other move, and every move of an operation
-- that has a log, appends to the log in the same statement.
CREATE TRIGGER operations_state_moves_with_its_log AFTER UPDATE OF state ON operations FOR EACH ROW
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

CREATE TRIGGER deliveries_answered_once AFTER UPDATE ON deliveries FOR EACH ROW
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

CREATE TRIGGER attempts_finished_once AFTER UPDATE ON attempts FOR EACH ROW
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
-- A handoff route's outbox entry may be cancelled (the operation ends
-- terminally) or made due at once (retry_now: the state stays, from_state
-- = to_state), and each is kept here like any other resolution.
CREATE TABLE interventions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    kind         text NOT NULL CONSTRAINT interventions_kind_check
        CHECK (kind IN ('happened', 'not_happened', 'abandon', 'replay', 'cancel', 'retry_now')),
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

-- The queries below are written against the DDL above. In them,
-- {{operation x}} stands for the columns of operations row x that the gate
-- reads (storage/queries.go keeps that list once), and {{attempt x}} for
-- those of attempts row x.

-- name: claim
-- A delivery's arrival (gate.Ledger.Claim), one element per delivery, each
-- naming an operation of its own: create the operation as the creating
-- claim describes it, or find it. A found operation with the claim's
-- fingerprint counts the delivery, which becomes a further delivery row
-- (answered at once when the operation is acknowledged); with another
-- fingerprint nothing is recorded on it. created tells the two apart (a
-- row this statement inserted has no xmax).
--
-- Each element gets one row back: its id, then the operation it found (f)
-- with its newest effect attempt after the first (la). A created operation
-- is not read back: the gate holds it as its claim describes it
-- (gate.Ledger.Claim returns no operation then), so f and la are NULL, and
-- f's id, never NULL for an operation found, is what tells the reader.
WITH c AS (
    SELECT
        unnest(@id::text[]) AS id, unnest(@created_at::timestamptz[]) AS created_at,
        unnest(@retain_until::timestamptz[]) AS retain_until,
        unnest(@publish_time::timestamptz[]) AS publish_time,
        unnest(@fingerprint_version::integer[]) AS fingerprint_version,
        unnest(@broker_attempt::integer[]) AS broker_attempt, unnest(@route::text[]) AS route,
        unnest(@tenant::text[]) AS tenant, unnest(@key_source::text[]) AS key_source,
        unnest(@key::text[]) AS key, unnest(@scope_key::text[]) AS scope_key,
        unnest(@fingerprint::text[]) AS fingerprint, unnest(@shape::text[]) AS shape,
        unnest(@dead_letter_policy::text[]) AS dead_letter_policy,
        unnest(@contract_version::text[]) AS contract_version,
        unnest(@idempotency_key::text[]) AS idempotency_key, unnest(@trace_id::text[]) AS trace_id,
        unnest(@span_id::text[]) AS span_id, unnest(@broker::text[]) AS broker,
        unnest(@source::text[]) AS source, unnest(@message_id::text[]) AS message_id,
        unnest(@owner::text[]) AS owner, unnest(@lease_deadline::timestamptz[]) AS lease_deadline,
        unnest(@state::text[]) AS state, unnest(@reason::text[]) AS reason,
        unnest(@a1_started_at::timestamptz[]) AS a1_started_at, unnest(@d1_decision::text[]) AS d1_decision,
        unnest(@d1_reason::text[]) AS d1_reason, unnest(@handed_off::boolean[]) AS handed_off,
        unnest(@dead_reason::text[]) AS dead_reason, unnest(@acked_decision::text[]) AS acked_decision,
        unnest(@acked_reason::text[]) AS acked_reason, unnest(@acked_anomaly::text[]) AS acked_anomaly,
        unnest(@outbox_publication_id::text[]) AS outbox_publication_id,
        unnest(@outbox_ordering_key::text[]) AS outbox_ordering_key,
        unnest(@outbox_attributes::jsonb[]) AS outbox_attributes, unnest(@outbox_data::bytea[]) AS outbox_data,
        unnest(@outbox_sealed_with::text[]) AS outbox_sealed_with,
        unnest(@outbox_sealed_pointers::jsonb[]) AS outbox_sealed_pointers
), claimed AS (
    INSERT INTO operations AS o (created_at, retain_until, publish_time, fingerprint_version, broker_attempt,
        id, route, tenant, key_source, key, scope_key, fingerprint, shape, dead_letter_policy,
        contract_version, idempotency_key, trace_id, span_id, broker, source, message_id, fence, owner,
        lease_start, waiting, handed_off_at, attempt_count, a1_fence, a1_contract, a1_started_at,
        lease_deadline, d1_decision, d1_reason, reason, state, updated_at)
    SELECT c.created_at, c.retain_until, c.publish_time, c.fingerprint_version, c.broker_attempt,
        c.id, c.route, c.tenant, c.key_source, c.key, c.scope_key, c.fingerprint, c.shape,
        c.dead_letter_policy, c.contract_version, c.idempotency_key, c.trace_id, c.span_id, c.broker,
        c.source, c.message_id, 1, c.owner, c.created_at,
        CASE WHEN c.state = 'terminal_failure' THEN 'terminal_failure' END,
        CASE WHEN c.handed_off THEN c.created_at END,
        (c.a1_started_at IS NOT NULL)::integer, CASE WHEN c.a1_started_at IS NOT NULL THEN 1 END,
        CASE WHEN c.a1_started_at IS NOT NULL THEN c.contract_version END, c.a1_started_at,
        c.lease_deadline, c.d1_decision, c.d1_reason, c.reason, c.state, c.created_at
    FROM c
    ORDER BY c.id
    ON CONFLICT (id) DO UPDATE SET delivery_count = o.delivery_count + (o.fingerprint = excluded.fingerprint)::integer
    RETURNING o.*, o.xmax = 0 AS created
), further AS (
    INSERT INTO deliveries (operation_id, n, broker, source, message_id, broker_attempt, received_at,
        publish_time, trace_id, found, decision, reason, anomaly)
    SELECT cl.id, cl.delivery_count, c.broker, c.source, c.message_id, c.broker_attempt, c.created_at,
        c.publish_time, c.trace_id, cl.state,
        CASE WHEN cl.state = 'acknowledged' THEN c.acked_decision ELSE '' END,
        CASE WHEN cl.state = 'acknowledged' THEN c.acked_reason ELSE '' END,
        CASE WHEN cl.state = 'acknowledged' THEN c.acked_anomaly ELSE '' END
    FROM claimed cl JOIN c ON c.id = cl.id
    WHERE NOT cl.created AND cl.fingerprint = c.fingerprint
-- begin: dead letters and handoffs
-- A batch without a dead letter or an outbox entry is sent without these
-- two (storage/groupcommit.go, claimPlainSQL): the server sets up every
-- statement of a query to run it, even one that writes nothing, and for
-- these two that was a tenth of the claim's cost on the common path.
), dead AS (
    INSERT INTO dead_letters (operation_id, reason, at)
    SELECT c.id, c.dead_reason, c.created_at FROM claimed cl JOIN c ON c.id = cl.id
    WHERE cl.created AND c.dead_reason IS NOT NULL
), handed AS (
    INSERT INTO outbox (operation_id, route, publication_id, broker, source, message_id, publish_time,
        ordering_key, attributes, data, sealed_with, sealed_pointers, created_at, next_attempt_at)
    SELECT c.id, c.route, c.outbox_publication_id, c.broker, c.source, c.message_id, c.publish_time,
        c.outbox_ordering_key, c.outbox_attributes, c.outbox_data, c.outbox_sealed_with, c.outbox_sealed_pointers,
        c.created_at, c.created_at
    FROM claimed cl JOIN c ON c.id = cl.id
    WHERE cl.created AND c.outbox_publication_id IS NOT NULL
-- end: dead letters and handoffs
)
SELECT cl.id, {{operation f}}, {{attempt la}}
FROM claimed cl
LEFT JOIN LATERAL (SELECT cl.* WHERE NOT cl.created) f ON true
LEFT JOIN LATERAL (
    SELECT * FROM attempts a
    WHERE NOT cl.created AND cl.attempt_count > 1 AND a.operation_id = cl.id AND a.kind = 'effect'
    ORDER BY a.n DESC LIMIT 1
) la ON true;

-- name: change
-- Named changes to existing operations (gate.Ledger.Write), one element
-- per change, each naming an operation of its own, whatever its kind:
-- every one is the same compare-and-set. A change applies only while the
-- row is in its expected state under its fence (an equal one; for a claim
-- or an intervention, a lower one, which the change replaces); then it
-- writes its columns, and its side rows go in with it. Off the common path
-- (logs, or a log already begun) its steps are appended to the log and the
-- operation enters the lanes. Each change is answered: ok, or why not.
WITH c AS (
    SELECT
        unnest(@i::integer[]) AS i, unnest(@id::text[]) AS id, unnest(@expect::text[]) AS expect,
        unnest(@fence::bigint[]) AS fence, unnest(@takes::boolean[]) AS takes,
        unnest(@at::timestamptz[]) AS at, unnest(@final::text[]) AS final, unnest(@steps::integer[]) AS steps,
        unnest(@logs::boolean[]) AS logs, unnest(@reason::text[]) AS reason, unnest(@owner::text[]) AS owner,
        unnest(@claims::boolean[]) AS claims, unnest(@settles::boolean[]) AS settles,
        unnest(@lease_deadline::timestamptz[]) AS lease_deadline,
        unnest(@lease_extensions::integer[]) AS lease_extensions,
        unnest(@lease_lost_at::timestamptz[]) AS lease_lost_at, unnest(@delivery_n::integer[]) AS delivery_n,
        unnest(@message_id::text[]) AS message_id, unnest(@answer_n::integer[]) AS answer_n,
        unnest(@answer_decision::text[]) AS answer_decision, unnest(@answer_reason::text[]) AS answer_reason,
        unnest(@finish_n::integer[]) AS finish_n, unnest(@finished_at::timestamptz[]) AS finished_at,
        unnest(@finish_outcome::text[]) AS finish_outcome, unnest(@finish_status::integer[]) AS finish_status,
        unnest(@finish_result_id::text[]) AS finish_result_id, unnest(@finish_reason::text[]) AS finish_reason,
        unnest(@start_n::integer[]) AS start_n, unnest(@started_at::timestamptz[]) AS started_at,
        unnest(@contract::text[]) AS contract, unnest(@lookup_n::integer[]) AS lookup_n,
        unnest(@lookup_started_at::timestamptz[]) AS lookup_started_at,
        unnest(@lookup_finished_at::timestamptz[]) AS lookup_finished_at,
        unnest(@lookup_outcome::text[]) AS lookup_outcome, unnest(@lookup_status::integer[]) AS lookup_status,
        unnest(@lookup_result_id::text[]) AS lookup_result_id, unnest(@lookup_reason::text[]) AS lookup_reason,
        unnest(@evidence::boolean[]) AS evidence, unnest(@result_id::text[]) AS result_id,
        unnest(@lane::text[]) AS lane, unnest(@acked::boolean[]) AS acked,
        unnest(@handed_off::boolean[]) AS handed_off, unnest(@grant::integer[]) AS grant_through,
        unnest(@schedule::boolean[]) AS schedule, unnest(@next_check_at::timestamptz[]) AS next_check_at,
        unnest(@checks::integer[]) AS checks, unnest(@dead_reason::text[]) AS dead_reason,
        unnest(@intervention::text[]) AS intervention, unnest(@actor::text[]) AS actor,
        unnest(@intervention_reason::text[]) AS intervention_reason,
        unnest(@intervention_result_id::text[]) AS intervention_result_id, unnest(@reset::boolean[]) AS reset
), changed AS (
    UPDATE operations o SET
        fence = c.fence,
        owner = coalesce(c.owner, o.owner),
        lease_start = CASE WHEN c.claims THEN c.at ELSE o.lease_start END,
        log_count = o.log_count + CASE WHEN c.logs OR o.log_count > 0 THEN c.steps ELSE 0 END,
        waiting = CASE
            WHEN coalesce(c.final, o.state) IN ('effect_indeterminate', 'terminal_failure') THEN coalesce(c.final, o.state)
            WHEN coalesce(c.final, o.state) = 'acknowledged' THEN NULL
            WHEN c.logs OR o.log_count > 0 THEN 'open'
            ELSE o.waiting END,
        lane = coalesce(c.lane, CASE WHEN coalesce(c.final, o.state) = 'effect_indeterminate' THEN o.lane ELSE '' END),
        grant_through = CASE WHEN c.grant_through > 0 THEN c.grant_through ELSE o.grant_through END,
        next_check_at = CASE WHEN c.schedule THEN c.next_check_at ELSE o.next_check_at END,
        checks = CASE WHEN c.schedule THEN c.checks ELSE o.checks END,
        handed_off_at = CASE WHEN c.handed_off THEN coalesce(o.handed_off_at, c.at) ELSE o.handed_off_at END,
        attempt_count = o.attempt_count + (c.lookup_n > 0)::integer + (c.start_n > 0)::integer,
        a1_fence = CASE WHEN c.start_n = 1 THEN c.fence ELSE o.a1_fence END,
        a1_contract = CASE WHEN c.start_n = 1 THEN c.contract ELSE o.a1_contract END,
        a1_started_at = CASE WHEN c.start_n = 1 THEN c.started_at ELSE o.a1_started_at END,
        lease_deadline = CASE WHEN c.claims OR c.settles THEN c.lease_deadline ELSE o.lease_deadline END,
        lease_extensions = CASE WHEN c.claims OR c.settles THEN c.lease_extensions ELSE o.lease_extensions END,
        lease_lost_at = CASE WHEN c.claims OR c.settles THEN c.lease_lost_at ELSE o.lease_lost_at END,
        a1_finished_at = CASE WHEN c.finish_n = 1 THEN c.finished_at ELSE o.a1_finished_at END,
        a1_outcome = CASE WHEN c.finish_n = 1 THEN c.finish_outcome ELSE o.a1_outcome END,
        a1_status = CASE WHEN c.finish_n = 1 THEN c.finish_status ELSE o.a1_status END,
        a1_result_id = CASE WHEN c.finish_n = 1 THEN c.finish_result_id ELSE o.a1_result_id END,
        a1_reason = CASE WHEN c.finish_n = 1 THEN c.finish_reason ELSE o.a1_reason END,
        d1_decision = CASE WHEN c.answer_n = 1 AND o.d1_decision = '' THEN c.answer_decision ELSE o.d1_decision END,
        d1_reason = CASE WHEN c.answer_n = 1 AND o.d1_decision = '' AND c.answer_reason <> '' THEN c.answer_reason
            ELSE o.d1_reason END,
        reason = coalesce(c.reason, o.reason),
        result_id = CASE WHEN c.evidence THEN c.result_id ELSE o.result_id END,
        evidence_at = CASE WHEN c.evidence THEN c.at ELSE o.evidence_at END,
        state = coalesce(c.final, o.state),
        acked_at = CASE WHEN c.acked THEN c.at ELSE o.acked_at END,
        updated_at = c.at
    FROM c
    WHERE o.id = c.id AND o.conflict_of IS NULL AND o.state = c.expect
        AND CASE WHEN c.takes THEN o.fence < c.fence ELSE o.fence = c.fence END
        -- Attempts are numbered in turn: a writer that read an older
        -- count is behind the operation.
        AND (c.lookup_n = 0 OR c.lookup_n = o.attempt_count + 1)
        AND (c.start_n = 0 OR c.start_n = o.attempt_count + 1 + (c.lookup_n > 0)::integer)
    RETURNING o.id, o.log_count
), logged AS (
    INSERT INTO transitions (operation_id, seq, from_state, to_state, at, fence, message_id, reason)
    SELECT ch.id, ch.log_count - c.steps + s.k, s.from_state, s.to_state, c.at, c.fence, c.message_id, s.reason
    FROM changed ch
    JOIN c ON c.id = ch.id
    JOIN (SELECT unnest(@step_i::integer[]) AS i, unnest(@step_k::integer[]) AS k,
        unnest(@step_from::text[]) AS from_state, unnest(@step_to::text[]) AS to_state,
        unnest(@step_reason::text[]) AS reason) s ON s.i = c.i
    WHERE ch.log_count > 0
), marked AS (
    -- The further delivery that took the lease gets its fence; the one this
    -- change answers gets its answer.
    UPDATE deliveries d SET
        fence = CASE WHEN d.n = c.delivery_n THEN c.fence ELSE d.fence END,
        decision = CASE WHEN d.n = c.answer_n AND d.decision = '' THEN c.answer_decision ELSE d.decision END,
        reason = CASE WHEN d.n = c.answer_n AND d.decision = '' AND c.answer_reason <> '' THEN c.answer_reason
            ELSE d.reason END
    FROM changed ch JOIN c ON c.id = ch.id
    WHERE d.operation_id = ch.id AND d.n IN (c.delivery_n, c.answer_n) AND d.n > 1
        -- Read the side table only when some change of the batch needs it
        -- (a condition on the batch alone runs once, before any scan): the
        -- common path's changes never do.
        AND (SELECT bool_or(x.delivery_n > 1 OR x.answer_n > 1) FROM c x)
), finished AS (
    UPDATE attempts a SET finished_at = c.finished_at, outcome = c.finish_outcome, status_code = c.finish_status,
        result_id = c.finish_result_id, reason = c.finish_reason
    FROM changed ch JOIN c ON c.id = ch.id
    WHERE c.finish_n > 1 AND a.operation_id = ch.id AND a.n = c.finish_n AND a.finished_at IS NULL
        AND (SELECT bool_or(x.finish_n > 1) FROM c x)
    RETURNING a.operation_id
), attempted AS (
    INSERT INTO attempts (operation_id, n, kind, fence, contract_version, started_at, finished_at, outcome,
        status_code, result_id, reason)
    SELECT ch.id, c.lookup_n, 'lookup', c.fence, c.contract, c.lookup_started_at, c.lookup_finished_at,
        c.lookup_outcome, c.lookup_status, c.lookup_result_id, c.lookup_reason
    FROM changed ch JOIN c ON c.id = ch.id WHERE c.lookup_n > 0
    UNION ALL
    SELECT ch.id, c.start_n, 'effect', c.fence, c.contract, c.started_at, NULL, '', 0, '', ''
    FROM changed ch JOIN c ON c.id = ch.id WHERE c.start_n > 1
), dead AS (
    INSERT INTO dead_letters (operation_id, reason, at)
    SELECT ch.id, c.dead_reason, c.at FROM changed ch JOIN c ON c.id = ch.id WHERE c.dead_reason IS NOT NULL
), intervened AS (
    INSERT INTO interventions (operation_id, kind, actor, reason, result_id, from_state, to_state, fence, at)
    SELECT ch.id, c.intervention, c.actor, c.intervention_reason, c.intervention_result_id, c.expect,
        coalesce(c.final, c.expect), c.fence, c.at
    FROM changed ch JOIN c ON c.id = ch.id WHERE c.intervention IS NOT NULL
), replayed AS (
    -- A replay hands a handed-off operation back to the relay now, not
    -- when the backoff of its last failed pass runs out.
    UPDATE outbox x SET next_attempt_at = least(x.next_attempt_at, c.at)
    FROM changed ch JOIN c ON c.id = ch.id
    WHERE c.intervention = 'replay' AND x.operation_id = ch.id AND x.delivered_at IS NULL
), leased AS (
    INSERT INTO lease_events (operation_id, kind, fence, at)
    SELECT ch.id, 'lost', c.fence, c.lease_lost_at FROM changed ch JOIN c ON c.id = ch.id
    WHERE c.settles AND c.lease_lost_at IS NOT NULL
    UNION ALL
    SELECT ch.id, 'reset', c.fence, c.at FROM changed ch JOIN c ON c.id = ch.id WHERE c.reset
)
SELECT CASE
    WHEN ch.id IS NULL THEN coalesce((
        SELECT CASE
            WHEN s.conflict_of IS NOT NULL THEN 'not_found'
            WHEN (c.takes AND s.fence >= c.fence) OR (NOT c.takes AND s.fence <> c.fence) THEN 'fenced'
            WHEN s.state <> c.expect THEN 'state_changed'
            -- It matched as the statement began, and a concurrent change
            -- moved it before the update got to it.
            ELSE 'state_changed' END
        FROM operations s WHERE s.id = c.id), 'not_found')
    WHEN c.finish_n > 1 AND NOT EXISTS (SELECT 1 FROM finished f WHERE f.operation_id = c.id)
        THEN ackgate_refused('operation ' || c.id || ': no unfinished attempt ' || c.finish_n)
    ELSE 'ok' END
FROM c LEFT JOIN changed ch ON ch.id = c.id
ORDER BY c.i;

-- name: row
-- The changes that write the operation's row alone (and its log, once it
-- left the common path): the common path's evidence and ack mark, and any
-- other change with no delivery, attempt, lease event, dead letter or
-- intervention to record. It is the change statement's compare-and-set and
-- assignments, restricted to what such a change sets, without the side
-- tables' statements: the server prepares every statement of a query to
-- run it, even those that write nothing, and on the common path that was
-- the larger part of the change's cost. TestRowIsTheChangeStatement holds
-- the two to the same rows and answers.
WITH c AS (
    SELECT
        unnest(@i::integer[]) AS i, unnest(@id::text[]) AS id, unnest(@expect::text[]) AS expect,
        unnest(@fence::bigint[]) AS fence, unnest(@at::timestamptz[]) AS at, unnest(@final::text[]) AS final,
        unnest(@steps::integer[]) AS steps, unnest(@logs::boolean[]) AS logs,
        unnest(@reason::text[]) AS reason, unnest(@settles::boolean[]) AS settles,
        unnest(@lease_deadline::timestamptz[]) AS lease_deadline,
        unnest(@lease_extensions::integer[]) AS lease_extensions, unnest(@answer_n::integer[]) AS answer_n,
        unnest(@answer_decision::text[]) AS answer_decision, unnest(@answer_reason::text[]) AS answer_reason,
        unnest(@finish_n::integer[]) AS finish_n, unnest(@finished_at::timestamptz[]) AS finished_at,
        unnest(@finish_outcome::text[]) AS finish_outcome, unnest(@finish_status::integer[]) AS finish_status,
        unnest(@finish_result_id::text[]) AS finish_result_id, unnest(@finish_reason::text[]) AS finish_reason,
        unnest(@evidence::boolean[]) AS evidence, unnest(@result_id::text[]) AS result_id,
        unnest(@lane::text[]) AS lane, unnest(@acked::boolean[]) AS acked
), changed AS (
    UPDATE operations o SET
        log_count = o.log_count + CASE WHEN c.logs OR o.log_count > 0 THEN c.steps ELSE 0 END,
        waiting = CASE
            WHEN coalesce(c.final, o.state) IN ('effect_indeterminate', 'terminal_failure') THEN coalesce(c.final, o.state)
            WHEN coalesce(c.final, o.state) = 'acknowledged' THEN NULL
            WHEN c.logs OR o.log_count > 0 THEN 'open'
            ELSE o.waiting END,
        lane = coalesce(c.lane, CASE WHEN coalesce(c.final, o.state) = 'effect_indeterminate' THEN o.lane ELSE '' END),
        lease_deadline = CASE WHEN c.settles THEN c.lease_deadline ELSE o.lease_deadline END,
        lease_extensions = CASE WHEN c.settles THEN c.lease_extensions ELSE o.lease_extensions END,
        lease_lost_at = CASE WHEN c.settles THEN NULL ELSE o.lease_lost_at END,
        a1_finished_at = CASE WHEN c.finish_n = 1 THEN c.finished_at ELSE o.a1_finished_at END,
        a1_outcome = CASE WHEN c.finish_n = 1 THEN c.finish_outcome ELSE o.a1_outcome END,
        a1_status = CASE WHEN c.finish_n = 1 THEN c.finish_status ELSE o.a1_status END,
        a1_result_id = CASE WHEN c.finish_n = 1 THEN c.finish_result_id ELSE o.a1_result_id END,
        a1_reason = CASE WHEN c.finish_n = 1 THEN c.finish_reason ELSE o.a1_reason END,
        d1_decision = CASE WHEN c.answer_n = 1 AND o.d1_decision = '' THEN c.answer_decision ELSE o.d1_decision END,
        d1_reason = CASE WHEN c.answer_n = 1 AND o.d1_decision = '' AND c.answer_reason <> '' THEN c.answer_reason
            ELSE o.d1_reason END,
        reason = coalesce(c.reason, o.reason),
        result_id = CASE WHEN c.evidence THEN c.result_id ELSE o.result_id END,
        evidence_at = CASE WHEN c.evidence THEN c.at ELSE o.evidence_at END,
        state = coalesce(c.final, o.state),
        acked_at = CASE WHEN c.acked THEN c.at ELSE o.acked_at END,
        updated_at = c.at
    FROM c
    WHERE o.id = c.id AND o.conflict_of IS NULL AND o.state = c.expect AND o.fence = c.fence
    RETURNING o.id, o.log_count
), logged AS (
    INSERT INTO transitions (operation_id, seq, from_state, to_state, at, fence, message_id, reason)
    SELECT ch.id, ch.log_count - c.steps + s.k, s.from_state, s.to_state, c.at, c.fence, '', s.reason
    FROM changed ch
    JOIN c ON c.id = ch.id
    JOIN (SELECT unnest(@step_i::integer[]) AS i, unnest(@step_k::integer[]) AS k,
        unnest(@step_from::text[]) AS from_state, unnest(@step_to::text[]) AS to_state,
        unnest(@step_reason::text[]) AS reason) s ON s.i = c.i
    WHERE ch.log_count > 0
)
SELECT CASE
    WHEN ch.id IS NULL THEN coalesce((
        SELECT CASE
            WHEN s.conflict_of IS NOT NULL THEN 'not_found'
            WHEN s.fence <> c.fence THEN 'fenced'
            ELSE 'state_changed' END
        FROM operations s WHERE s.id = c.id), 'not_found')
    ELSE 'ok' END
FROM c LEFT JOIN changed ch ON ch.id = c.id
ORDER BY c.i;

-- name: answer
-- What deliveries were told (gate.Ledger.AnswerDelivery), each once: the
-- first on its operation's row, the further ones in deliveries. A reset
-- lease met by the delivery is kept with the operation's lease events.
WITH c AS (
    SELECT
        unnest(@id::text[]) AS id, unnest(@n::integer[]) AS n, unnest(@decision::text[]) AS decision,
        unnest(@reason::text[]) AS reason, unnest(@anomaly::text[]) AS anomaly,
        unnest(@reset_fence::bigint[]) AS reset_fence, unnest(@at::timestamptz[]) AS at
), first AS (
    UPDATE operations o SET d1_decision = c.decision,
        d1_reason = CASE WHEN c.reason = '' THEN o.d1_reason ELSE c.reason END, d1_anomaly = c.anomaly
    FROM c WHERE c.n = 1 AND o.id = c.id AND o.d1_decision = ''
), further AS (
    UPDATE deliveries d SET decision = c.decision,
        reason = CASE WHEN c.reason = '' THEN d.reason ELSE c.reason END, anomaly = c.anomaly
    FROM c WHERE c.n > 1 AND d.operation_id = c.id AND d.n = c.n AND d.decision = ''
), leased AS (
    INSERT INTO lease_events (operation_id, kind, fence, at)
    SELECT o.id, 'reset', c.reset_fence, c.at FROM c JOIN operations o ON o.id = c.id WHERE c.reset_fence > 0
)
SELECT count(*) FROM c;
