-- The first delivery's span id, beside its trace id: a later delivery of the
-- same operation links its own trace to that span, so an operator who finds
-- any delivery's trace can follow it back to where the work began.

-- +goose Up
ALTER TABLE operations ADD COLUMN span_id text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE operations DROP COLUMN span_id;
