-- The lifecycle guard names its legal edges in one array constant instead
-- of a list of row pairs. Postgres reads a trigger's WHEN clause back from
-- its stored node tree for every statement that may fire it, and every
-- evidence and ack mark sets state: the row pairs made that tree 27 KB of
-- text parsed per statement, the array makes it 9 KB. What the guard
-- refuses is unchanged.

-- +goose Up
-- +goose StatementBegin
DROP TRIGGER operations_transitions_follow_the_table ON operations;
CREATE TRIGGER operations_transitions_follow_the_table AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state <> OLD.state AND NOT (
        OLD.state || '>' || NEW.state = ANY ('{
            received>reserved, received>conflicting, received>terminal_failure,
            reserved>pending_effect, reserved>effect_confirmed, reserved>effect_indeterminate,
            reserved>terminal_failure,
            pending_effect>reserved, pending_effect>effect_confirmed, pending_effect>effect_indeterminate,
            pending_effect>terminal_failure,
            effect_indeterminate>pending_effect, effect_indeterminate>effect_confirmed,
            effect_indeterminate>terminal_failure,
            effect_confirmed>ack_pending, ack_pending>acknowledged,
            terminal_failure>pending_effect, terminal_failure>effect_confirmed}'::text[])
        OR (OLD.state IN ('reserved', 'pending_effect') AND NEW.state = 'ack_pending'
            AND OLD.evidence_at IS NULL AND NEW.evidence_at IS NOT NULL)
        OR (OLD.state = 'effect_confirmed' AND NEW.state = 'acknowledged'
            AND OLD.acked_at IS NULL AND NEW.acked_at IS NOT NULL)
        OR (OLD.state = 'effect_indeterminate' AND NEW.state = 'acknowledged'
            AND OLD.evidence_at IS NULL AND NEW.evidence_at IS NOT NULL AND OLD.acked_at IS NULL AND NEW.acked_at IS NOT NULL)))
    EXECUTE FUNCTION ackgate_refuse('AG001', 'the transition is not in the lifecycle');
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER operations_transitions_follow_the_table ON operations;
CREATE TRIGGER operations_transitions_follow_the_table AFTER UPDATE OF state ON operations FOR EACH ROW
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
-- +goose StatementEnd
