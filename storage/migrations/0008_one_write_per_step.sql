-- One row write per step, and many steps per commit.
--
-- Before this migration a change moved the state column one edge at a time
-- (an UPDATE per edge) and counted deliveries and attempts with UPDATEs of
-- their own, so one fresh message rewrote its operation row about a dozen
-- times in three commits. Now a change appends its edges to the log first,
-- in one multi-row INSERT, and then writes the row once, straight to where
-- the log ends. The guards still judge every edge, at the log: an entry must
-- be an allowed edge and continue the log; the row may only move to where
-- the log ends.
--
-- ackgate_write performs one whole named change (gate/change.go) and answers
-- with a word instead of raising, inside its own subtransaction: several
-- deliveries' changes can then share one statement and one commit, and one
-- refused or failed change takes back only its own writes.

-- +goose Up

-- Lease loss is a fact of its own, apart from the effect's state: when the
-- owner found its lease gone while its call ran.
ALTER TABLE operations ADD COLUMN lease_lost_at timestamptz;

-- The broker's publish time beside the time the gateway received the
-- delivery, so the record shows how old a message was when it arrived and
-- what the retention and clock-skew checks judged; NULL when the broker sent
-- none.
ALTER TABLE deliveries ADD COLUMN publish_time timestamptz;

-- A log entry must be an allowed edge and continue from where the log ended.
-- It no longer has to arrive where the row is: the row follows the log in the
-- same change, and ackgate_operations_logged checks that it did.
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

-- The row's state may change only to where its log now ends, which the log's
-- own guard reached one allowed edge at a time. An insert may name any state:
-- its log must begin at received and end there by commit
-- (ackgate_operations_logged), or nothing of it stays.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_operations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    logged_state ackgate_state;
BEGIN
    IF TG_OP = 'INSERT' THEN
        RETURN NEW;
    END IF;
    IF NEW.state <> OLD.state THEN
        SELECT to_state INTO logged_state FROM transitions
            WHERE operation_id = NEW.id ORDER BY seq DESC LIMIT 1;
        IF logged_state IS DISTINCT FROM NEW.state THEN
            IF NOT EXISTS (SELECT 1 FROM allowed_transitions WHERE from_state = OLD.state AND to_state = NEW.state) THEN
                RAISE EXCEPTION 'operation %: transition % -> % is not allowed', OLD.id, OLD.state, NEW.state
                    USING ERRCODE = 'AG001';
            END IF;
            RAISE EXCEPTION 'operation %: state % is not where its event log ends (%)',
                OLD.id, NEW.state, coalesce(logged_state::text, 'empty')
                USING ERRCODE = 'AG004';
        END IF;
    END IF;
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'operation %: fencing token may not go down (% -> %)', OLD.id, OLD.fence, NEW.fence
            USING ERRCODE = 'AG002';
    END IF;
    IF NEW.id <> OLD.id OR NEW.scope_key <> OLD.scope_key OR NEW.fingerprint <> OLD.fingerprint
        OR NEW.conflict_of IS DISTINCT FROM OLD.conflict_of OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'operation %: identity columns are immutable', OLD.id
            USING ERRCODE = 'AG003';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- The lanes are what operators and gauges list by state; settled work leaves
-- the index, so it stays the size of the open work, not of history.
DROP INDEX operations_state_created;
CREATE INDEX operations_open_by_state ON operations (state, created_at, id)
    WHERE state IN ('received', 'reserved', 'pending_effect', 'effect_indeterminate',
                    'effect_confirmed', 'ack_pending', 'terminal_failure');

-- One named change, as JSON (storage/write.go builds it). The answer is 'ok',
-- or why nothing of the change was written: 'not_found', 'fenced',
-- 'state_changed', 'exists', or 'error <SQLSTATE>: <message>'.
-- +goose StatementBegin
CREATE FUNCTION ackgate_write(c jsonb) RETURNS text LANGUAGE plpgsql AS $$
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

-- +goose Down
DROP FUNCTION ackgate_write(jsonb);
ALTER TABLE deliveries DROP COLUMN publish_time;
ALTER TABLE operations DROP COLUMN lease_lost_at;
DROP INDEX operations_open_by_state;
CREATE INDEX operations_state_created ON operations (state, created_at, id);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_operations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT EXISTS (SELECT 1 FROM allowed_transitions
                       WHERE from_state IS NULL AND to_state = NEW.state) THEN
            RAISE EXCEPTION 'operation % cannot begin in state %', NEW.id, NEW.state
                USING ERRCODE = 'AG001';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.state <> OLD.state AND NOT EXISTS (
        SELECT 1 FROM allowed_transitions WHERE from_state = OLD.state AND to_state = NEW.state) THEN
        RAISE EXCEPTION 'operation %: transition % -> % is not allowed', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'AG001';
    END IF;
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'operation %: fencing token may not go down (% -> %)', OLD.id, OLD.fence, NEW.fence
            USING ERRCODE = 'AG002';
    END IF;
    IF NEW.id <> OLD.id OR NEW.scope_key <> OLD.scope_key OR NEW.fingerprint <> OLD.fingerprint
        OR NEW.conflict_of IS DISTINCT FROM OLD.conflict_of OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'operation %: identity columns are immutable', OLD.id
            USING ERRCODE = 'AG003';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_transitions_append() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq      integer;
    last_state    ackgate_state;
    current_state ackgate_state;
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
    SELECT state INTO current_state FROM operations WHERE id = NEW.operation_id;
    IF current_state IS DISTINCT FROM NEW.to_state THEN
        RAISE EXCEPTION 'operation %: log entry to % but the operation is %',
            NEW.operation_id, NEW.to_state, coalesce(current_state::text, '(missing)')
            USING ERRCODE = 'AG005';
    END IF;
    NEW.seq := coalesce(last_seq, 0) + 1;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
