-- A group-commit batch in a fixed number of statements.
--
-- A profile of the backends under load (16 deliveries in flight) put about
-- three quarters of Postgres's CPU inside ackgate_write and its triggers and
-- almost none in writing heap or WAL: a fifth went to starting executors. The
-- cost was the number of statements. Group commit sends up to 32 changes in
-- one statement, but each still ran ackgate_write in a subtransaction of its
-- own, eight to thirteen statements apiece.
--
-- ackgate_write_batch applies a batch whose changes name distinct operations
-- with one statement per step of the work, whatever the batch's size: lock
-- the existing rows in id order, judge every change as ackgate_write judges
-- it (the same checks in the same order, the same answer words), insert the
-- created rows, append every accepted change's log entries, write the rows
-- once, then deliveries, attempts and dead letters, and last the check that
-- each row is where its log ends. A change refused with a word writes
-- nothing and costs its neighbours nothing.
--
-- It has no subtransactions, so it cannot take back one change alone: if
-- anything raises (a guard refusing an edge, an attempt that is not open, a
-- duplicate attempt), the whole statement fails and the caller sends the same
-- batch again through ackgate_write, which answers each change on its own
-- (storage/write.go). The guards are not touched: every trigger and key of
-- 0003, 0008, 0011 and 0016 fires on these rows as on anyone's.
--
-- Each column is computed from the change's JSON by the same expression
-- ackgate_write uses, so the rows are the same, column for column.
--
-- Its statements run on generic plans. Left to choose, the plan cache
-- prices a plan made for "some array" above one made for the array at
-- hand and so plans every statement again on every call, which cost more
-- than the statements themselves: 2.5 times the Postgres CPU of
-- ackgate_write for a batch of one. The statements find rows by key, so
-- one plan serves every batch. Small batches still go change by change
-- (storage/write.go, minSetBatch).

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION ackgate_write_batch(cs jsonb[]) RETURNS text[] LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_answers   text[];
    v_creating  boolean;
    v_updating  boolean;
    v_counting  boolean;
    v_delivered boolean;
    v_answering boolean;
    v_starting  boolean;
    v_finishing boolean;
    v_dead      boolean;
    v_id        text;
    v_state     text;
    v_logged    text;
BEGIN
    -- Lock the rows the batch names that exist, in the batch's order: the
    -- caller sorts it by id, as it does for ackgate_write, so concurrent
    -- batches lock in one order whichever way each goes. Then judge each
    -- change. The count reads every locked row whatever join the planner
    -- picks, so every lock is taken here, in order, and none later by a
    -- write.
    --
    -- A creating claim whose id is taken is 'exists', as the unique
    -- violation ackgate_write catches. The id is looked up here rather than
    -- left to INSERT ... ON CONFLICT DO NOTHING, whose speculative insertion
    -- costs every created row one more WAL record and index probe. A row
    -- committed after this look-up, or a new id with a taken scope key
    -- (the gate derives the id from the scope key, gate/identity.go, so
    -- only a hand-made change has one), makes the insert raise, and the
    -- batch goes change by change.
    WITH batch AS (
        SELECT t.c, t.i FROM unnest(cs) WITH ORDINALITY AS t(c, i)
    ), locked AS MATERIALIZED (
        SELECT o.id, o.state, o.fence FROM batch b JOIN operations o ON o.id = b.c->>'id'
        WHERE b.c->>'kind' = 'delivery' OR (b.c->'claim'->'row' IS NULL AND o.conflict_of IS NULL)
        ORDER BY b.i
        FOR UPDATE OF o
    ), judged AS (
        SELECT b.c, b.i, CASE
            WHEN b.c->>'kind' = 'delivery' THEN CASE WHEN l.id IS NULL THEN 'not_found' ELSE 'ok' END
            WHEN b.c->'claim'->'row' IS NOT NULL THEN
                CASE WHEN EXISTS (SELECT 1 FROM operations e WHERE e.id = b.c->>'id') THEN 'exists' ELSE 'ok' END
            WHEN l.id IS NULL THEN 'not_found'
            WHEN (b.c->'claim' IS NOT NULL AND l.fence >= (b.c->>'fence')::bigint)
                OR (b.c->'claim' IS NULL AND l.fence <> (b.c->>'fence')::bigint) THEN 'fenced'
            WHEN l.state <> (b.c->>'expect')::ackgate_state THEN 'state_changed'
            ELSE 'ok' END AS answer
        FROM batch b LEFT JOIN locked l ON l.id = b.c->>'id'
    )
    SELECT array_agg(j.answer ORDER BY j.i),
        coalesce(bool_or(j.answer = 'ok' AND j.c->>'kind' <> 'delivery' AND j.c->'claim'->'row' IS NOT NULL), false),
        coalesce(bool_or(j.answer = 'ok' AND j.c->>'kind' <> 'delivery' AND j.c->'claim'->'row' IS NULL), false),
        coalesce(bool_or(j.answer = 'ok' AND j.c->>'kind' = 'delivery'), false),
        coalesce(bool_or(j.answer = 'ok' AND coalesce(j.c->'claim'->'delivery', j.c->'delivery') IS NOT NULL), false),
        coalesce(bool_or(j.answer = 'ok' AND j.c->'settle'->'answer'->>'owner' <> ''), false),
        coalesce(bool_or(j.answer = 'ok' AND j.c->'start' IS NOT NULL), false),
        coalesce(bool_or(j.answer = 'ok' AND j.c->'settle'->'finish' IS NOT NULL), false),
        coalesce(bool_or(j.answer = 'ok' AND j.c->'dead_letter' IS NOT NULL), false)
      INTO v_answers, v_creating, v_updating, v_counting, v_delivered, v_answering, v_starting,
        v_finishing, v_dead
      FROM judged j
      CROSS JOIN (SELECT count(*) FROM locked) AS every_lock;

    IF v_creating THEN
        INSERT INTO operations (id, scope_key, tenant, route, key_source, key, fingerprint,
            fingerprint_version, state, shape, dead_letter_policy, contract_version, idempotency_key,
            fence, owner, lease_start, lease_deadline, lease_extensions, delivery_count, attempt_count,
            first_attempt_at, result_id, evidence_at, reason, lane, trace_id, span_id, created_at,
            updated_at, retain_until)
        SELECT t.c->>'id', r->>'scope_key', r->>'tenant', r->>'route', r->>'key_source',
            r->>'key', r->>'fingerprint', (r->>'fingerprint_version')::integer,
            (t.c->'steps'->-1->>'to')::ackgate_state,
            r->>'shape', r->>'dead_letter_policy', r->>'contract_version',
            r->>'idempotency_key', (t.c->>'fence')::bigint, t.c->'claim'->>'owner', (t.c->>'at')::timestamptz,
            (t.c->'claim'->>'lease_deadline')::timestamptz, 0,
            (coalesce(t.c->'claim'->'delivery', t.c->'delivery') IS NOT NULL)::integer,
            (t.c->'start' IS NOT NULL)::integer,
            CASE WHEN t.c->'start'->>'kind' = 'effect' THEN (t.c->'start'->>'started_at')::timestamptz END,
            CASE WHEN t.c->>'kind' = 'confirm' THEN t.c->>'result_id' ELSE '' END,
            CASE WHEN t.c->>'kind' = 'confirm' THEN (t.c->>'at')::timestamptz END,
            t.c->>'reason',
            CASE WHEN t.c->>'kind' = 'indeterminate' THEN t.c->>'lane' ELSE '' END,
            t.c->'claim'->>'trace_id', r->>'span_id', (r->>'created_at')::timestamptz,
            (t.c->>'at')::timestamptz, (r->>'retain_until')::timestamptz
        FROM unnest(cs) WITH ORDINALITY AS t(c, i)
        CROSS JOIN LATERAL (SELECT t.c->'claim'->'row' AS r) AS x
        WHERE v_answers[t.i] = 'ok' AND t.c->>'kind' <> 'delivery' AND r IS NOT NULL
        ORDER BY t.i;
    END IF;

    -- Every accepted change's log entries, change by change, step by step:
    -- the log's own guard judges each edge as it arrives.
    INSERT INTO transitions (operation_id, from_state, to_state, at, fence, message_id, reason)
    SELECT t.c->>'id', (s->>'from')::ackgate_state, (s->>'to')::ackgate_state, (t.c->>'at')::timestamptz,
        (t.c->>'fence')::bigint, coalesce(coalesce(t.c->'claim'->'delivery', t.c->'delivery')->>'message_id', ''),
        coalesce(s->>'reason', '')
    FROM unnest(cs) WITH ORDINALITY AS t(c, i)
    CROSS JOIN LATERAL jsonb_array_elements(coalesce(t.c->'steps', '[]'::jsonb)) WITH ORDINALITY AS e(s, j)
    WHERE v_answers[t.i] = 'ok'
    ORDER BY t.i, e.j;

    -- The one write of each existing row: each named change sets its own
    -- columns, as in ackgate_write.
    IF v_updating THEN
        UPDATE operations o SET
            state = coalesce((x.c->'steps'->-1->>'to')::ackgate_state, o.state),
            updated_at = (x.c->>'at')::timestamptz,
            fence = CASE WHEN x.c->'claim' IS NOT NULL THEN (x.c->>'fence')::bigint ELSE o.fence END,
            owner = CASE WHEN x.c->'claim' IS NOT NULL THEN x.c->'claim'->>'owner' ELSE o.owner END,
            lease_start = CASE WHEN x.c->'claim' IS NOT NULL THEN (x.c->>'at')::timestamptz ELSE o.lease_start END,
            lease_deadline = CASE WHEN x.c->'claim' IS NOT NULL THEN (x.c->'claim'->>'lease_deadline')::timestamptz
                WHEN x.c->'settle' IS NOT NULL THEN (x.c->'settle'->>'lease_deadline')::timestamptz
                ELSE o.lease_deadline END,
            lease_lost_at = CASE WHEN x.c->'claim' IS NOT NULL THEN NULL
                WHEN x.c->'settle' IS NOT NULL THEN (x.c->'settle'->>'lease_lost_at')::timestamptz
                ELSE o.lease_lost_at END,
            lease_extensions = CASE WHEN x.c->'claim' IS NOT NULL THEN 0
                WHEN x.c->'settle' IS NOT NULL THEN (x.c->'settle'->>'lease_extensions')::integer
                ELSE o.lease_extensions END,
            trace_id = CASE WHEN x.c->'claim' IS NOT NULL THEN x.c->'claim'->>'trace_id' ELSE o.trace_id END,
            delivery_count = o.delivery_count
                + (coalesce(x.c->'claim'->'delivery', x.c->'delivery') IS NOT NULL)::integer,
            attempt_count = o.attempt_count + (x.c->'start' IS NOT NULL)::integer,
            first_attempt_at = CASE WHEN x.c->'start'->>'kind' = 'effect'
                THEN coalesce(o.first_attempt_at, (x.c->'start'->>'started_at')::timestamptz)
                ELSE o.first_attempt_at END,
            result_id = CASE WHEN x.c->>'kind' = 'confirm' THEN x.c->>'result_id' ELSE o.result_id END,
            evidence_at = CASE WHEN x.c->>'kind' = 'confirm' THEN (x.c->>'at')::timestamptz ELSE o.evidence_at END,
            lane = CASE WHEN x.c->>'kind' = 'indeterminate' THEN x.c->>'lane' ELSE o.lane END,
            acked_at = CASE WHEN x.c->>'kind' = 'acked' THEN (x.c->>'at')::timestamptz ELSE o.acked_at END,
            reason = CASE WHEN x.c->>'kind' = 'acked' THEN o.reason ELSE x.c->>'reason' END
        FROM (SELECT t.c FROM unnest(cs) WITH ORDINALITY AS t(c, i)
              WHERE v_answers[t.i] = 'ok' AND t.c->>'kind' <> 'delivery' AND t.c->'claim'->'row' IS NULL) AS x
        WHERE o.id = x.c->>'id';
    END IF;

    -- Deliveries that changed nothing but their own record.
    IF v_counting THEN
        UPDATE operations SET delivery_count = delivery_count + 1
        WHERE id = ANY (ARRAY(SELECT t.c->>'id' FROM unnest(cs) WITH ORDINALITY AS t(c, i)
                              WHERE v_answers[t.i] = 'ok' AND t.c->>'kind' = 'delivery'));
    END IF;

    IF v_delivered THEN
        INSERT INTO deliveries (operation_id, broker, source, message_id, broker_attempt, publish_time,
            received_at, decision, reason, anomaly, trace_id, owner)
        SELECT t.c->>'id', d->>'broker', d->>'source', d->>'message_id',
            (d->>'broker_attempt')::integer, (d->>'publish_time')::timestamptz,
            (d->>'received_at')::timestamptz, d->>'decision',
            d->>'reason', d->>'anomaly', d->>'trace_id', d->>'owner'
        FROM unnest(cs) WITH ORDINALITY AS t(c, i)
        CROSS JOIN LATERAL (SELECT coalesce(t.c->'claim'->'delivery', t.c->'delivery') AS d) AS x
        WHERE v_answers[t.i] = 'ok' AND d IS NOT NULL
        ORDER BY t.i;
    END IF;
    -- The answers and the finished attempts find their rows one change at
    -- a time by index (OFFSET 0 keeps each look-up apart) and are written
    -- by ctid. Joined plainly, the planner judged "decision = ''" and
    -- "finished_at IS NULL" so selective that it read the whole table of a
    -- young ledger instead of one index entry per change. A row someone
    -- changed since the look-up has a new ctid and is not written, as the
    -- row conditions would not have let it be.
    IF v_answering THEN
        UPDATE deliveries dl SET decision = y.a->>'decision',
            reason = CASE WHEN y.a->>'reason' = '' THEN dl.reason ELSE y.a->>'reason' END
        FROM (SELECT x.a, d.tid
              FROM (SELECT t.c->>'id' AS id, t.c->'settle'->'answer' AS a FROM unnest(cs) WITH ORDINALITY AS t(c, i)
                    WHERE v_answers[t.i] = 'ok' AND t.c->'settle'->'answer'->>'owner' <> '') AS x
              CROSS JOIN LATERAL (SELECT ctid AS tid FROM deliveries
                                  WHERE operation_id = x.id AND owner = x.a->>'owner' AND decision = ''
                                  OFFSET 0) AS d) AS y
        WHERE dl.ctid = y.tid;
    END IF;
    IF v_starting THEN
        INSERT INTO attempts (operation_id, n, kind, idempotency_key, fence, started_at)
        SELECT t.c->>'id', (t.c->'start'->>'n')::integer, t.c->'start'->>'kind', t.c->'start'->>'idempotency_key',
            (t.c->>'fence')::bigint, (t.c->'start'->>'started_at')::timestamptz
        FROM unnest(cs) WITH ORDINALITY AS t(c, i)
        WHERE v_answers[t.i] = 'ok' AND t.c->'start' IS NOT NULL
        ORDER BY t.i;
    END IF;
    IF v_finishing THEN
        WITH f AS (
            SELECT t.c->>'id' AS id, t.c->'settle'->'finish' AS fin FROM unnest(cs) WITH ORDINALITY AS t(c, i)
            WHERE v_answers[t.i] = 'ok' AND t.c->'settle'->'finish' IS NOT NULL
        ), finished AS (
            UPDATE attempts a SET finished_at = (y.fin->>'finished_at')::timestamptz, outcome = y.fin->>'outcome',
                status_code = (y.fin->>'status_code')::integer, result_id = y.fin->>'result_id',
                reason = y.fin->>'reason'
            FROM (SELECT f.fin, o.tid FROM f
                  CROSS JOIN LATERAL (SELECT ctid AS tid FROM attempts
                                      WHERE operation_id = f.id AND n = (f.fin->>'n')::integer
                                        AND finished_at IS NULL
                                      OFFSET 0) AS o) AS y
            WHERE a.ctid = y.tid
            RETURNING a.operation_id
        )
        SELECT f.id, f.fin->>'n' INTO v_id, v_state FROM f
        WHERE NOT EXISTS (SELECT 1 FROM finished WHERE finished.operation_id = f.id)
        LIMIT 1;
        IF v_id IS NOT NULL THEN
            RAISE EXCEPTION 'operation %: no unfinished attempt %', v_id, v_state USING ERRCODE = 'AG020';
        END IF;
    END IF;
    IF v_dead THEN
        INSERT INTO dead_letters (operation_id, reason, at)
        SELECT t.c->>'id', t.c->'dead_letter'->>'reason', (t.c->'dead_letter'->>'at')::timestamptz
        FROM unnest(cs) WITH ORDINALITY AS t(c, i)
        WHERE v_answers[t.i] = 'ok' AND t.c->'dead_letter' IS NOT NULL
        ORDER BY t.i
        ON CONFLICT (operation_id) DO NOTHING;
    END IF;

    -- Each written row must now be where its log ends; the deferred
    -- ackgate_operations_logged checks it again at commit.
    IF v_creating OR v_updating THEN
        SELECT o.id, o.state, l.to_state INTO v_id, v_state, v_logged
        FROM unnest(cs) WITH ORDINALITY AS t(c, i)
        JOIN operations o ON o.id = t.c->>'id'
        LEFT JOIN LATERAL (SELECT to_state FROM transitions
                           WHERE operation_id = o.id ORDER BY seq DESC LIMIT 1) AS l ON true
        WHERE v_answers[t.i] = 'ok' AND t.c->>'kind' <> 'delivery' AND l.to_state IS DISTINCT FROM o.state
        LIMIT 1;
        IF v_id IS NOT NULL THEN
            RAISE EXCEPTION 'operation %: state % is not where its event log ends (%)',
                v_id, v_state, coalesce(v_logged, 'empty')
                USING ERRCODE = 'AG004';
        END IF;
    END IF;
    RETURN v_answers;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION ackgate_write_batch(jsonb[]);
