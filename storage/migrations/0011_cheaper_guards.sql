-- The same guards for less work per change.
--
-- A profile of the load run (perf on the backends, and pg_stat_user_functions
-- with track_functions = all) put about three quarters of the ledger's CPU
-- inside ackgate_write and its triggers, spread over many small statements
-- rather than in any one of them. Two things stood out:
--
--   * ackgate_write ran SET CONSTRAINTS operations_state_logged IMMEDIATE and
--     then DEFERRED once per change, to check inside the change's own
--     subtransaction that the row ended where its log does. Each SET
--     CONSTRAINTS looks the constraint and its trigger up in the catalogue;
--     together they were about a tenth of the ledger's CPU. ackgate_write now
--     checks that one row itself, with one indexed read. The deferred trigger
--     is unchanged and still checks every writer at commit.
--   * each log entry's guard, and the deferred check, made two queries where
--     one does; each query is an executor start-up of its own.
--
-- Nothing the ledger accepts or refuses changes: the same conditions raise
-- the same SQLSTATEs with the same messages, in the same order. Writers other
-- than ackgate_write (plain INSERTs into transitions, UPDATEs of operations,
-- retention DELETEs) need nothing new: no column to maintain, no setting, no
-- function to call.

-- +goose Up

-- A log entry must be an allowed edge and continue from where the log ended;
-- seq is assigned here. One query reads both the edge and the log's end.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_transitions_append() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq   integer;
    last_state ackgate_state;
    edge_ok    boolean;
BEGIN
    SELECT l.seq, l.to_state,
           EXISTS (SELECT 1 FROM allowed_transitions a
                   WHERE a.from_state IS NOT DISTINCT FROM NEW.from_state AND a.to_state = NEW.to_state)
      INTO last_seq, last_state, edge_ok
      FROM (SELECT 1) AS one
      LEFT JOIN LATERAL (SELECT seq, to_state FROM transitions
                         WHERE operation_id = NEW.operation_id ORDER BY seq DESC LIMIT 1) AS l ON true;
    IF NOT edge_ok THEN
        RAISE EXCEPTION 'operation %: transition % -> % is not allowed',
            NEW.operation_id, coalesce(NEW.from_state::text, '(new)'), NEW.to_state
            USING ERRCODE = 'AG001';
    END IF;
    IF last_state IS DISTINCT FROM NEW.from_state THEN
        RAISE EXCEPTION 'operation %: log entry from % does not continue the log, which ends at %',
            NEW.operation_id, coalesce(NEW.from_state::text, '(new)'), coalesce(last_state::text, '(empty)')
            USING ERRCODE = 'AG005';
    END IF;
    NEW.seq := coalesce(last_seq, 0) + 1;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- At commit, an operation's state must be where its log ends. One query reads
-- the row and the log's end together.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_operations_logged() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_state ackgate_state;
    logged_state  ackgate_state;
BEGIN
    SELECT o.state, l.to_state INTO current_state, logged_state
      FROM operations o
      LEFT JOIN LATERAL (SELECT to_state FROM transitions
                         WHERE operation_id = o.id ORDER BY seq DESC LIMIT 1) AS l ON true
     WHERE o.id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL; -- deleted later in the same transaction
    END IF;
    IF logged_state IS DISTINCT FROM current_state THEN
        RAISE EXCEPTION 'operation %: state % is not where its event log ends (%)',
            NEW.id, current_state, coalesce(logged_state::text, 'empty')
            USING ERRCODE = 'AG004';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- ackgate_write as in 0008, except for its last check: the row it wrote must
-- be where its log ends, read directly instead of by firing the deferred
-- trigger early. The answer words and the refusals are the same.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_write(c jsonb) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_id      text := c->>'id';
    v_kind    text := c->>'kind';
    v_at      timestamptz := (c->>'at')::timestamptz;
    v_fence   bigint := (c->>'fence')::bigint;
    v_claim   jsonb := c->'claim';
    v_settle  jsonb := c->'settle';
    v_row     jsonb := c->'claim'->'row';
    v_d       jsonb := coalesce(c->'claim'->'delivery', c->'delivery');
    v_start   jsonb := c->'start';
    v_fin     jsonb := c->'settle'->'finish';
    v_ans     jsonb := c->'settle'->'answer';
    v_steps   jsonb := coalesce(c->'steps', '[]'::jsonb);
    v_final   ackgate_state;
    cur_state ackgate_state;
    cur_fence bigint;
    logged    ackgate_state;
BEGIN
    IF jsonb_array_length(v_steps) > 0 THEN
        v_final := (v_steps->-1->>'to')::ackgate_state;
    END IF;

    IF v_kind = 'delivery' THEN
        -- A delivery that changed nothing but its own record.
        UPDATE operations SET delivery_count = delivery_count + 1 WHERE id = v_id;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
    ELSIF v_row IS NOT NULL THEN
        INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint,
            fingerprint_version, state, shape, dead_letter_policy, contract_version, idempotency_key,
            fence, owner, lease_start, lease_deadline, lease_extensions, delivery_count, attempt_count,
            first_attempt_at, result_id, evidence_at, reason, lane, trace_id, span_id, created_at,
            updated_at, retain_until)
        VALUES (v_id, v_row->>'scope_key', v_row->>'tenant', v_row->>'route', v_row->>'key_source',
            v_row->>'key', v_row->>'fingerprint', (v_row->>'fingerprint_version')::integer, v_final,
            v_row->>'shape', v_row->>'dead_letter_policy', v_row->>'contract_version',
            v_row->>'idempotency_key', v_fence, v_claim->>'owner', v_at,
            (v_claim->>'lease_deadline')::timestamptz, 0, (v_d IS NOT NULL)::integer,
            (v_start IS NOT NULL)::integer,
            CASE WHEN v_start->>'kind' = 'effect' THEN (v_start->>'started_at')::timestamptz END,
            CASE WHEN v_kind = 'confirm' THEN c->>'result_id' ELSE '' END,
            CASE WHEN v_kind = 'confirm' THEN v_at END,
            c->>'reason',
            CASE WHEN v_kind = 'indeterminate' THEN c->>'lane' ELSE '' END,
            v_claim->>'trace_id', v_row->>'span_id', (v_row->>'created_at')::timestamptz, v_at,
            (v_row->>'retain_until')::timestamptz);
    ELSE
        SELECT state, fence INTO cur_state, cur_fence FROM operations
            WHERE id = v_id AND conflict_of IS NULL FOR UPDATE;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
        IF (v_claim IS NOT NULL AND cur_fence >= v_fence) OR (v_claim IS NULL AND cur_fence <> v_fence) THEN
            RETURN 'fenced';
        END IF;
        IF cur_state <> (c->>'expect')::ackgate_state THEN
            RETURN 'state_changed';
        END IF;
    END IF;

    INSERT INTO transitions (operation_id, from_state, to_state, at, fence, message_id, reason)
    SELECT v_id, (s->>'from')::ackgate_state, (s->>'to')::ackgate_state, v_at, v_fence,
        coalesce(v_d->>'message_id', ''), coalesce(s->>'reason', '')
    FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(s, i)
    ORDER BY i;

    IF v_row IS NULL AND v_kind <> 'delivery' THEN
        -- The one write of the row: each named change sets its own columns.
        UPDATE operations SET
            state = coalesce(v_final, state),
            updated_at = v_at,
            fence = CASE WHEN v_claim IS NOT NULL THEN v_fence ELSE fence END,
            owner = CASE WHEN v_claim IS NOT NULL THEN v_claim->>'owner' ELSE owner END,
            lease_start = CASE WHEN v_claim IS NOT NULL THEN v_at ELSE lease_start END,
            lease_deadline = CASE WHEN v_claim IS NOT NULL THEN (v_claim->>'lease_deadline')::timestamptz
                WHEN v_settle IS NOT NULL THEN (v_settle->>'lease_deadline')::timestamptz
                ELSE lease_deadline END,
            lease_lost_at = CASE WHEN v_claim IS NOT NULL THEN NULL
                WHEN v_settle IS NOT NULL THEN (v_settle->>'lease_lost_at')::timestamptz
                ELSE lease_lost_at END,
            lease_extensions = CASE WHEN v_claim IS NOT NULL THEN 0
                WHEN v_settle IS NOT NULL THEN (v_settle->>'lease_extensions')::integer
                ELSE lease_extensions END,
            trace_id = CASE WHEN v_claim IS NOT NULL THEN v_claim->>'trace_id' ELSE trace_id END,
            delivery_count = delivery_count + (v_d IS NOT NULL)::integer,
            attempt_count = attempt_count + (v_start IS NOT NULL)::integer,
            first_attempt_at = CASE WHEN v_start->>'kind' = 'effect'
                THEN coalesce(first_attempt_at, (v_start->>'started_at')::timestamptz) ELSE first_attempt_at END,
            result_id = CASE WHEN v_kind = 'confirm' THEN c->>'result_id' ELSE result_id END,
            evidence_at = CASE WHEN v_kind = 'confirm' THEN v_at ELSE evidence_at END,
            lane = CASE WHEN v_kind = 'indeterminate' THEN c->>'lane' ELSE lane END,
            acked_at = CASE WHEN v_kind = 'acked' THEN v_at ELSE acked_at END,
            reason = CASE WHEN v_kind = 'acked' THEN reason ELSE c->>'reason' END
        WHERE id = v_id
        RETURNING state INTO cur_state;
    ELSIF v_row IS NOT NULL THEN
        cur_state := v_final;
    END IF;

    IF v_d IS NOT NULL THEN
        INSERT INTO deliveries (operation_id, broker, source, message_id, broker_attempt, publish_time,
            received_at, decision, reason, anomaly, trace_id, owner)
        VALUES (v_id, v_d->>'broker', v_d->>'source', v_d->>'message_id',
            (v_d->>'broker_attempt')::integer, (v_d->>'publish_time')::timestamptz,
            (v_d->>'received_at')::timestamptz, v_d->>'decision',
            v_d->>'reason', v_d->>'anomaly', v_d->>'trace_id', v_d->>'owner');
    END IF;
    IF v_ans IS NOT NULL AND v_ans->>'owner' <> '' THEN
        UPDATE deliveries SET decision = v_ans->>'decision',
            reason = CASE WHEN v_ans->>'reason' = '' THEN reason ELSE v_ans->>'reason' END
        WHERE operation_id = v_id AND owner = v_ans->>'owner' AND decision = '';
    END IF;
    IF v_start IS NOT NULL THEN
        INSERT INTO attempts (operation_id, n, kind, idempotency_key, fence, started_at)
        VALUES (v_id, (v_start->>'n')::integer, v_start->>'kind', v_start->>'idempotency_key', v_fence,
            (v_start->>'started_at')::timestamptz);
    END IF;
    IF v_fin IS NOT NULL THEN
        UPDATE attempts SET finished_at = (v_fin->>'finished_at')::timestamptz, outcome = v_fin->>'outcome',
            status_code = (v_fin->>'status_code')::integer, result_id = v_fin->>'result_id',
            reason = v_fin->>'reason'
        WHERE operation_id = v_id AND n = (v_fin->>'n')::integer AND finished_at IS NULL;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'operation %: no unfinished attempt %', v_id, v_fin->>'n' USING ERRCODE = 'AG020';
        END IF;
    END IF;
    IF c->'dead_letter' IS NOT NULL THEN
        INSERT INTO dead_letters (operation_id, reason, at)
        VALUES (v_id, c->'dead_letter'->>'reason', (c->'dead_letter'->>'at')::timestamptz)
        ON CONFLICT (operation_id) DO NOTHING;
    END IF;
    -- The row must now be where its log ends. Checked here, inside this
    -- change's own subtransaction, rather than at a commit it may share; the
    -- deferred ackgate_operations_logged checks it again at that commit.
    IF v_kind <> 'delivery' THEN
        SELECT to_state INTO logged FROM transitions
            WHERE operation_id = v_id ORDER BY seq DESC LIMIT 1;
        IF logged IS DISTINCT FROM cur_state THEN
            RAISE EXCEPTION 'operation %: state % is not where its event log ends (%)',
                v_id, cur_state, coalesce(logged::text, 'empty')
                USING ERRCODE = 'AG004';
        END IF;
    END IF;
    RETURN 'ok';
EXCEPTION
    WHEN unique_violation THEN
        RETURN 'exists';
    WHEN OTHERS THEN
        RETURN 'error ' || SQLSTATE || ': ' || SQLERRM;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_transitions_append() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq   integer;
    last_state ackgate_state;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allowed_transitions
                   WHERE from_state IS NOT DISTINCT FROM NEW.from_state AND to_state = NEW.to_state) THEN
        RAISE EXCEPTION 'operation %: transition % -> % is not allowed',
            NEW.operation_id, coalesce(NEW.from_state::text, '(new)'), NEW.to_state
            USING ERRCODE = 'AG001';
    END IF;
    SELECT seq, to_state INTO last_seq, last_state FROM transitions
        WHERE operation_id = NEW.operation_id ORDER BY seq DESC LIMIT 1;
    IF last_state IS DISTINCT FROM NEW.from_state THEN
        RAISE EXCEPTION 'operation %: log entry from % does not continue the log, which ends at %',
            NEW.operation_id, coalesce(NEW.from_state::text, '(new)'), coalesce(last_state::text, '(empty)')
            USING ERRCODE = 'AG005';
    END IF;
    NEW.seq := coalesce(last_seq, 0) + 1;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_operations_logged() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_state ackgate_state;
    logged_state  ackgate_state;
BEGIN
    SELECT state INTO current_state FROM operations WHERE id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL; -- deleted later in the same transaction
    END IF;
    SELECT to_state INTO logged_state FROM transitions
        WHERE operation_id = NEW.id ORDER BY seq DESC LIMIT 1;
    IF logged_state IS DISTINCT FROM current_state THEN
        RAISE EXCEPTION 'operation %: state % is not where its event log ends (%)',
            NEW.id, current_state, coalesce(logged_state::text, 'empty')
            USING ERRCODE = 'AG004';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_write(c jsonb) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_id      text := c->>'id';
    v_kind    text := c->>'kind';
    v_at      timestamptz := (c->>'at')::timestamptz;
    v_fence   bigint := (c->>'fence')::bigint;
    v_claim   jsonb := c->'claim';
    v_settle  jsonb := c->'settle';
    v_row     jsonb := c->'claim'->'row';
    v_d       jsonb := coalesce(c->'claim'->'delivery', c->'delivery');
    v_start   jsonb := c->'start';
    v_fin     jsonb := c->'settle'->'finish';
    v_ans     jsonb := c->'settle'->'answer';
    v_steps   jsonb := coalesce(c->'steps', '[]'::jsonb);
    v_final   ackgate_state;
    cur_state ackgate_state;
    cur_fence bigint;
BEGIN
    IF jsonb_array_length(v_steps) > 0 THEN
        v_final := (v_steps->-1->>'to')::ackgate_state;
    END IF;

    IF v_kind = 'delivery' THEN
        -- A delivery that changed nothing but its own record.
        UPDATE operations SET delivery_count = delivery_count + 1 WHERE id = v_id;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
    ELSIF v_row IS NOT NULL THEN
        INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint,
            fingerprint_version, state, shape, dead_letter_policy, contract_version, idempotency_key,
            fence, owner, lease_start, lease_deadline, lease_extensions, delivery_count, attempt_count,
            first_attempt_at, result_id, evidence_at, reason, lane, trace_id, span_id, created_at,
            updated_at, retain_until)
        VALUES (v_id, v_row->>'scope_key', v_row->>'tenant', v_row->>'route', v_row->>'key_source',
            v_row->>'key', v_row->>'fingerprint', (v_row->>'fingerprint_version')::integer, v_final,
            v_row->>'shape', v_row->>'dead_letter_policy', v_row->>'contract_version',
            v_row->>'idempotency_key', v_fence, v_claim->>'owner', v_at,
            (v_claim->>'lease_deadline')::timestamptz, 0, (v_d IS NOT NULL)::integer,
            (v_start IS NOT NULL)::integer,
            CASE WHEN v_start->>'kind' = 'effect' THEN (v_start->>'started_at')::timestamptz END,
            CASE WHEN v_kind = 'confirm' THEN c->>'result_id' ELSE '' END,
            CASE WHEN v_kind = 'confirm' THEN v_at END,
            c->>'reason',
            CASE WHEN v_kind = 'indeterminate' THEN c->>'lane' ELSE '' END,
            v_claim->>'trace_id', v_row->>'span_id', (v_row->>'created_at')::timestamptz, v_at,
            (v_row->>'retain_until')::timestamptz);
    ELSE
        SELECT state, fence INTO cur_state, cur_fence FROM operations
            WHERE id = v_id AND conflict_of IS NULL FOR UPDATE;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
        IF (v_claim IS NOT NULL AND cur_fence >= v_fence) OR (v_claim IS NULL AND cur_fence <> v_fence) THEN
            RETURN 'fenced';
        END IF;
        IF cur_state <> (c->>'expect')::ackgate_state THEN
            RETURN 'state_changed';
        END IF;
    END IF;

    INSERT INTO transitions (operation_id, from_state, to_state, at, fence, message_id, reason)
    SELECT v_id, (s->>'from')::ackgate_state, (s->>'to')::ackgate_state, v_at, v_fence,
        coalesce(v_d->>'message_id', ''), coalesce(s->>'reason', '')
    FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(s, i)
    ORDER BY i;

    IF v_row IS NULL AND v_kind <> 'delivery' THEN
        -- The one write of the row: each named change sets its own columns.
        UPDATE operations SET
            state = coalesce(v_final, state),
            updated_at = v_at,
            fence = CASE WHEN v_claim IS NOT NULL THEN v_fence ELSE fence END,
            owner = CASE WHEN v_claim IS NOT NULL THEN v_claim->>'owner' ELSE owner END,
            lease_start = CASE WHEN v_claim IS NOT NULL THEN v_at ELSE lease_start END,
            lease_deadline = CASE WHEN v_claim IS NOT NULL THEN (v_claim->>'lease_deadline')::timestamptz
                WHEN v_settle IS NOT NULL THEN (v_settle->>'lease_deadline')::timestamptz
                ELSE lease_deadline END,
            lease_lost_at = CASE WHEN v_claim IS NOT NULL THEN NULL
                WHEN v_settle IS NOT NULL THEN (v_settle->>'lease_lost_at')::timestamptz
                ELSE lease_lost_at END,
            lease_extensions = CASE WHEN v_claim IS NOT NULL THEN 0
                WHEN v_settle IS NOT NULL THEN (v_settle->>'lease_extensions')::integer
                ELSE lease_extensions END,
            trace_id = CASE WHEN v_claim IS NOT NULL THEN v_claim->>'trace_id' ELSE trace_id END,
            delivery_count = delivery_count + (v_d IS NOT NULL)::integer,
            attempt_count = attempt_count + (v_start IS NOT NULL)::integer,
            first_attempt_at = CASE WHEN v_start->>'kind' = 'effect'
                THEN coalesce(first_attempt_at, (v_start->>'started_at')::timestamptz) ELSE first_attempt_at END,
            result_id = CASE WHEN v_kind = 'confirm' THEN c->>'result_id' ELSE result_id END,
            evidence_at = CASE WHEN v_kind = 'confirm' THEN v_at ELSE evidence_at END,
            lane = CASE WHEN v_kind = 'indeterminate' THEN c->>'lane' ELSE lane END,
            acked_at = CASE WHEN v_kind = 'acked' THEN v_at ELSE acked_at END,
            reason = CASE WHEN v_kind = 'acked' THEN reason ELSE c->>'reason' END
        WHERE id = v_id;
    END IF;

    IF v_d IS NOT NULL THEN
        INSERT INTO deliveries (operation_id, broker, source, message_id, broker_attempt, publish_time,
            received_at, decision, reason, anomaly, trace_id, owner)
        VALUES (v_id, v_d->>'broker', v_d->>'source', v_d->>'message_id',
            (v_d->>'broker_attempt')::integer, (v_d->>'publish_time')::timestamptz,
            (v_d->>'received_at')::timestamptz, v_d->>'decision',
            v_d->>'reason', v_d->>'anomaly', v_d->>'trace_id', v_d->>'owner');
    END IF;
    IF v_ans IS NOT NULL AND v_ans->>'owner' <> '' THEN
        UPDATE deliveries SET decision = v_ans->>'decision',
            reason = CASE WHEN v_ans->>'reason' = '' THEN reason ELSE v_ans->>'reason' END
        WHERE operation_id = v_id AND owner = v_ans->>'owner' AND decision = '';
    END IF;
    IF v_start IS NOT NULL THEN
        INSERT INTO attempts (operation_id, n, kind, idempotency_key, fence, started_at)
        VALUES (v_id, (v_start->>'n')::integer, v_start->>'kind', v_start->>'idempotency_key', v_fence,
            (v_start->>'started_at')::timestamptz);
    END IF;
    IF v_fin IS NOT NULL THEN
        UPDATE attempts SET finished_at = (v_fin->>'finished_at')::timestamptz, outcome = v_fin->>'outcome',
            status_code = (v_fin->>'status_code')::integer, result_id = v_fin->>'result_id',
            reason = v_fin->>'reason'
        WHERE operation_id = v_id AND n = (v_fin->>'n')::integer AND finished_at IS NULL;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'operation %: no unfinished attempt %', v_id, v_fin->>'n' USING ERRCODE = 'AG020';
        END IF;
    END IF;
    IF c->'dead_letter' IS NOT NULL THEN
        INSERT INTO dead_letters (operation_id, reason, at)
        VALUES (v_id, c->'dead_letter'->>'reason', (c->'dead_letter'->>'at')::timestamptz)
        ON CONFLICT (operation_id) DO NOTHING;
    END IF;
    -- The row must now be where its log ends. Checked here, inside this
    -- change's own subtransaction, rather than at a commit it may share.
    SET CONSTRAINTS operations_state_logged IMMEDIATE;
    SET CONSTRAINTS operations_state_logged DEFERRED;
    RETURN 'ok';
EXCEPTION
    WHEN unique_violation THEN
        RETURN 'exists';
    WHEN OTHERS THEN
        RETURN 'error ' || SQLSTATE || ': ' || SQLERRM;
END
$$;
-- +goose StatementEnd
