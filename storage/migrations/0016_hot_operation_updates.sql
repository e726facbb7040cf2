-- Updates of the hot path that rewrite no index.
--
-- A fresh message writes its operation row three times: the insert of its
-- claim, the update of its confirmation and the update of its ack. Postgres
-- can write an update as a heap-only tuple (HOT), with no new index entry,
-- only when no index mentions a column whose value changed, in its key or
-- its predicate. Five indexes mentioned state (the open work and the lanes
-- of 0008, 0012 and 0015), so every state change wrote a new entry into
-- every index of the table, seven of them on the hot path.
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

ALTER TABLE operations SET (fillfactor = 50);
ALTER TABLE deliveries SET (fillfactor = 85);

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
