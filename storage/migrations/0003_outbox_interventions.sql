-- An operator may cancel a handoff route's outbox entry, or make it due at
-- once; both are recorded as interventions, under their own kinds.

-- +goose Up
ALTER TABLE interventions DROP CONSTRAINT interventions_kind_check,
    ADD CONSTRAINT interventions_kind_check
        CHECK (kind IN ('happened', 'not_happened', 'abandon', 'replay', 'cancel', 'retry_now'));

-- +goose Down
-- Rows of the new kinds cannot be kept under the old check: going back
-- drops them, with the operations' other history intact.
ALTER TABLE interventions DISABLE TRIGGER interventions_kept;
DELETE FROM interventions WHERE kind IN ('cancel', 'retry_now');
ALTER TABLE interventions ENABLE TRIGGER interventions_kept;
ALTER TABLE interventions DROP CONSTRAINT interventions_kind_check,
    ADD CONSTRAINT interventions_kind_check CHECK (kind IN ('happened', 'not_happened', 'abandon', 'replay'));
