-- The ledger enforces its own rules, so that neither a bug in the gateway nor a
-- hand-written UPDATE can produce evidence the lifecycle does not allow.
--
-- Errors raised here use SQLSTATE class AG, which storage/errors.go translates:
--   AG001 transition not in allowed_transitions
--   AG002 fencing token decreased
--   AG003 evidence is append-only or still retained
--   AG004 a state change without its event log entry
--   AG005 an event log entry that does not continue the log
--   AG010 operation not found        (raised by ackgate_lock_operation)
--   AG011 fencing token superseded   (raised by ackgate_lock_operation)
--   AG012 state changed underneath   (raised by ackgate_lock_operation)
--   AG020 a precondition of a ledger write failed (ackgate_require)

-- +goose Up

-- Every state change of an operation must follow an allowed edge, a record
-- must begin in the state the NULL edge leads to, fencing tokens never go
-- down, and what identifies an operation never changes.
-- +goose StatementBegin
CREATE FUNCTION ackgate_operations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER operations_guard BEFORE INSERT OR UPDATE ON operations
    FOR EACH ROW EXECUTE FUNCTION ackgate_operations_guard();

-- Evidence leaves only when its retention has run out.
-- +goose StatementBegin
CREATE FUNCTION ackgate_operations_retained() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.retain_until > now() THEN
        RAISE EXCEPTION 'operation % is retained until %', OLD.id, OLD.retain_until
            USING ERRCODE = 'AG003';
    END IF;
    RETURN OLD;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER operations_retained BEFORE DELETE ON operations
    FOR EACH ROW EXECUTE FUNCTION ackgate_operations_retained();

-- At commit, an operation's state must be where its event log ends: a state
-- change nobody logged is refused, whoever made it. Deferred, because a change
-- updates the row first and appends the log entry right after.
-- +goose StatementBegin
CREATE FUNCTION ackgate_operations_logged() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE CONSTRAINT TRIGGER operations_state_logged AFTER INSERT OR UPDATE OF state ON operations
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ackgate_operations_logged();

-- A log entry must be an allowed edge, continue from where the log ended, and
-- arrive where the operation now is. seq is assigned here, so the log has no
-- gaps and no reordering. Callers hold the operation's row lock, which
-- serialises appends per operation.
-- +goose StatementBegin
CREATE FUNCTION ackgate_transitions_append() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER transitions_append BEFORE INSERT ON transitions
    FOR EACH ROW EXECUTE FUNCTION ackgate_transitions_append();

-- History is never rewritten. Rows may go only together with their operation
-- (the cascade from a retention delete), which is why DELETE checks the parent.
-- +goose StatementBegin
CREATE FUNCTION ackgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT 1 FROM operations WHERE id = OLD.operation_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'AG003';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER transitions_append_only BEFORE UPDATE OR DELETE ON transitions
    FOR EACH ROW EXECUTE FUNCTION ackgate_append_only();
CREATE TRIGGER deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION ackgate_append_only();
CREATE TRIGGER dead_letters_append_only BEFORE UPDATE OR DELETE ON dead_letters
    FOR EACH ROW EXECUTE FUNCTION ackgate_append_only();

-- The compare-and-set at the head of every Apply: lock the operation and check
-- the caller's expectations, raising a distinct SQLSTATE for each way they can
-- fail. Because it raises, the rest of the pipelined change never runs.
-- +goose StatementBegin
CREATE FUNCTION ackgate_lock_operation(p_id text, p_expect ackgate_state, p_fence bigint, p_claim boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    current_state ackgate_state;
    current_fence bigint;
BEGIN
    SELECT state, fence INTO current_state, current_fence FROM operations
        WHERE id = p_id AND conflict_of IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'operation % not found', p_id USING ERRCODE = 'AG010';
    END IF;
    IF (p_claim AND current_fence >= p_fence) OR (NOT p_claim AND current_fence <> p_fence) THEN
        RAISE EXCEPTION 'operation %: fence % is recorded, % was offered', p_id, current_fence, p_fence
            USING ERRCODE = 'AG011';
    END IF;
    IF current_state <> p_expect THEN
        RAISE EXCEPTION 'operation %: state is %, expected %', p_id, current_state, p_expect
            USING ERRCODE = 'AG012';
    END IF;
END
$$;
-- +goose StatementEnd

-- Turns a false condition inside a pipelined change into an error, which rolls
-- the whole change back.
-- +goose StatementBegin
CREATE FUNCTION ackgate_require(ok boolean, message text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'AG020';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION ackgate_require(boolean, text);
DROP FUNCTION ackgate_lock_operation(text, ackgate_state, bigint, boolean);
DROP TRIGGER dead_letters_append_only ON dead_letters;
DROP TRIGGER deliveries_append_only ON deliveries;
DROP TRIGGER transitions_append_only ON transitions;
DROP FUNCTION ackgate_append_only();
DROP TRIGGER transitions_append ON transitions;
DROP FUNCTION ackgate_transitions_append();
DROP TRIGGER operations_state_logged ON operations;
DROP FUNCTION ackgate_operations_logged();
DROP TRIGGER operations_retained ON operations;
DROP FUNCTION ackgate_operations_retained();
DROP TRIGGER operations_guard ON operations;
DROP FUNCTION ackgate_operations_guard();
