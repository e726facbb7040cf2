-- The lifecycle guard lists its composite moves as edges.
--
-- The composite moves (to ack_pending from reserved or pending_effect, to
-- acknowledged from effect_confirmed or effect_indeterminate) carried
-- their witnesses in the guard's WHEN clause: no evidence before and
-- evidence after, no ack before and an ack after. The CHECK constraints
-- confirmed_states_have_evidence and acknowledged_has_its_ack already
-- demand exactly that of the rows on either side, so the guard names the
-- moves as edges and leaves the witnesses to them. What is refused is
-- unchanged; a composite move without its witness is refused by the CHECK
-- (23514) instead of the guard (AG001).
--
-- Why: Postgres reads a trigger's WHEN clause back from its stored node
-- text and prepares it again for every statement that may fire it, and
-- every evidence and ack mark sets state. The clause goes from 9.3 KB of
-- text to 4.5 KB.

-- +goose Up
-- +goose StatementBegin
DROP TRIGGER operations_transitions_follow_the_table ON operations;
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
-- +goose StatementEnd

-- +goose Down
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
