-- Updates of the hot path that rewrite no index.
--
-- A fresh message writes its operation row three times: the insert of its
-- claim, the update of its confirmation and the update of its ack. Postgres
-- can write an update as a heap-only tuple (HOT), with no new index entry,
-- only when no index mentions a column whose value changed, in its key or
-- its predicate. Five indexes mentioned state (the open work and the lanes
-- of 0008, 0012 and 0015), so every state change wrote a new entry into
-- each index that held the row: seven for a confirmation, six for an ack.
--
-- Those indexes now read waiting instead, which says what the operation
-- waits in and changes far less often than state:
--
--   'open'                  work goes on: received, reserved, pending_effect,
--                           effect_confirmed, ack_pending
--   the state               an operator's or the reconciler's lanes:
--                           effect_indeterminate, terminal_failure, conflicting
--   NULL                    nothing waits: acknowledged
--
-- A confirmation (pending_effect to ack_pending) leaves waiting at 'open',
-- so it changes no indexed value and can be HOT. An ack still leaves the
-- open-work index and so cannot be; it writes the entries of the history
-- indexes, as before.
--
-- waiting is not written by anyone: the row guard derives it from state on
-- every insert and update, whoever writes, so it cannot drift from state.
-- Adding it rewrites nothing; only unacknowledged rows are backfilled.
--
-- The delivery answer (decision '' to ack, nack or reject) was never HOT
-- either: deliveries_undecided has decision in its predicate. The answer
-- finds its row by operation (deliveries_operation), among the few
-- deliveries one operation has, so that index goes.
--
-- Both tables keep room on each page for the next version of their rows,
-- since a HOT update must fit on the page of the row it replaces.
--
-- And ackgate_write locks the row of a change through the primary key only
-- (below): a new ledger's cached plan could read all of operations_scope_key
-- for it.
--
-- Nothing the ledger accepts or refuses changes: the guard judges the same
-- conditions with the same SQLSTATEs and messages, in the same order.

-- +goose Up

ALTER TABLE operations ADD COLUMN waiting text;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ackgate_operations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    logged_state ackgate_state;
BEGIN
    NEW.waiting := CASE
        WHEN NEW.state IN ('effect_indeterminate', 'terminal_failure', 'conflicting') THEN NEW.state::text
        WHEN NEW.state = 'acknowledged' THEN NULL
        ELSE 'open' END;
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

-- The guard derives the value; this only makes it fire on the rows that
-- need one.
UPDATE operations SET waiting = 'open' WHERE state <> 'acknowledged';

-- Open work and the lanes, by what they wait in, oldest first: the lanes
-- without a route, the lane gauges, and the listing by state.
DROP INDEX operations_open_by_state;
DROP INDEX operations_conflicts_created;
CREATE INDEX operations_waiting ON operations (waiting, created_at, id) WHERE waiting IS NOT NULL;

-- The lanes of one route; work that goes on is not in it.
DROP INDEX operations_lanes_by_route;
CREATE INDEX operations_lanes_by_route ON operations (route, waiting, created_at, id)
    WHERE waiting IN ('effect_indeterminate', 'terminal_failure', 'conflicting');

-- The dead-letter listing (0012), newest first, with and without a route.
DROP INDEX operations_terminal_created;
DROP INDEX operations_terminal_route_created;
CREATE INDEX operations_terminal_created ON operations (created_at, id)
    WHERE waiting IN ('terminal_failure', 'conflicting');
CREATE INDEX operations_terminal_route_created ON operations (route, created_at, id)
    WHERE waiting IN ('terminal_failure', 'conflicting');

DROP INDEX deliveries_undecided;

-- Half of each new operations page stays free for the next versions of its
-- rows: at 80 and 65 only some confirmations found room on their page
-- (docs/performance.md, fourth round). Existing pages are not rewritten.
ALTER TABLE operations SET (fillfactor = 50);
ALTER TABLE deliveries SET (fillfactor = 85);

-- ackgate_write as in 0011, except for how a change that is not a claim
-- locks its row. It read "WHERE id = $1 AND conflict_of IS NULL", which
-- operations_scope_key can also serve (its predicate is conflict_of IS
-- NULL) by reading the whole index; on a table without statistics, a new
-- ledger's, the planner prices both the same, and the plan a session
-- caches then reads every entry for each change until the first ANALYZE.
-- The row is now read by id alone, which only the primary key serves, and
-- a conflict record is answered 'not_found' as before.
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
    conflict  boolean;
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
        -- By id alone, so that only the primary key can serve it (see above).
        SELECT state, fence, conflict_of IS NOT NULL INTO cur_state, cur_fence, conflict FROM operations
            WHERE id = v_id FOR UPDATE;
        IF NOT FOUND OR conflict THEN
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
ALTER TABLE deliveries RESET (fillfactor);
ALTER TABLE operations RESET (fillfactor);
CREATE INDEX deliveries_undecided ON deliveries (operation_id, owner) WHERE decision = '';
DROP INDEX operations_terminal_route_created;
DROP INDEX operations_terminal_created;
CREATE INDEX operations_terminal_created ON operations (created_at, id)
    WHERE state IN ('terminal_failure', 'conflicting');
CREATE INDEX operations_terminal_route_created ON operations (route, created_at, id)
    WHERE state IN ('terminal_failure', 'conflicting');
DROP INDEX operations_lanes_by_route;
CREATE INDEX operations_lanes_by_route ON operations (route, state, created_at, id)
    WHERE state IN ('effect_indeterminate', 'terminal_failure', 'conflicting');
DROP INDEX operations_waiting;
CREATE INDEX operations_conflicts_created ON operations (created_at, id)
    WHERE state = 'conflicting';
CREATE INDEX operations_open_by_state ON operations (state, created_at, id)
    WHERE state IN ('received', 'reserved', 'pending_effect', 'effect_indeterminate',
                    'effect_confirmed', 'ack_pending', 'terminal_failure');
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
ALTER TABLE operations DROP COLUMN waiting;
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
