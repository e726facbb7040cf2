-- The recovery lanes: evidence that arrives outside any delivery.
--
-- An indeterminate operation may now be settled by the reconciler's lookup
-- or by an operator, and a terminal one replayed; both ways back to
-- pending_effect carry a grant of exactly one attempt, kept on the row.
-- Operators' resolutions are history of their own (who, why, what changed),
-- as append-only as the event log.

-- +goose Up

INSERT INTO allowed_transitions (from_state, to_state) VALUES
    -- a lookup found the effect absent, or an operator says it did not happen
    ('effect_indeterminate', 'pending_effect'),
    -- an operator replays a terminal operation whose effect is not confirmed
    ('terminal_failure', 'pending_effect'),
    -- an operator found that a terminally failed effect happened after all
    ('terminal_failure', 'effect_confirmed');

-- grant: the attempt number up to which one more attempt is allowed
-- (gate.Operation.Grant). next_check_at and checks: the reconciler's
-- schedule for an indeterminate operation of a lookup route.
ALTER TABLE operations
    ADD COLUMN grant_through integer NOT NULL DEFAULT 0 CHECK (grant_through >= 0),
    ADD COLUMN next_check_at timestamptz,
    ADD COLUMN checks integer NOT NULL DEFAULT 0 CHECK (checks >= 0);

-- The purge walks expired evidence oldest first. retain_until never changes
-- after the insert, so this index costs the hot path's updates nothing.
CREATE INDEX operations_retain_until ON operations (retain_until);

CREATE TABLE manual_interventions (
    operation_id text NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    seq          integer NOT NULL CHECK (seq > 0),
    kind         text NOT NULL CHECK (kind IN ('happened', 'not_happened', 'abandon', 'replay')),
    actor        text NOT NULL CHECK (actor <> '' AND length(actor) <= 256),
    reason       text NOT NULL CHECK (reason <> ''),
    result_id    text NOT NULL DEFAULT '',
    from_state   ackgate_state NOT NULL,
    to_state     ackgate_state NOT NULL,
    fence        bigint NOT NULL,
    at           timestamptz NOT NULL,
    PRIMARY KEY (operation_id, seq),
    CHECK ((kind = 'happened') = (result_id <> ''))
);

CREATE TRIGGER manual_interventions_append_only BEFORE UPDATE OR DELETE ON manual_interventions
    FOR EACH ROW EXECUTE FUNCTION ackgate_append_only();

-- +goose Down
DROP TABLE manual_interventions;
DROP INDEX operations_retain_until;
ALTER TABLE operations DROP COLUMN checks, DROP COLUMN next_check_at, DROP COLUMN grant_through;
DELETE FROM allowed_transitions WHERE (from_state, to_state) IN (
    ('effect_indeterminate', 'pending_effect'),
    ('terminal_failure', 'pending_effect'),
    ('terminal_failure', 'effect_confirmed'));
