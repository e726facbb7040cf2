-- The evidence lifecycle as data: the nine states and the edges between them.
-- gate.Transitions() holds the same table in Go; a storage test reads this one
-- back and compares, so neither can drift alone.

-- +goose Up

-- A domain, so every column holding a state rejects anything but the nine.
CREATE DOMAIN ackgate_state AS text CHECK (VALUE IN (
    'received',
    'conflicting',
    'reserved',
    'pending_effect',
    'effect_indeterminate',
    'effect_confirmed',
    'ack_pending',
    'acknowledged',
    'terminal_failure'
));

-- from_state NULL is the edge into existence: every record begins received.
CREATE TABLE allowed_transitions (
    from_state ackgate_state,
    to_state   ackgate_state NOT NULL,
    UNIQUE NULLS NOT DISTINCT (from_state, to_state)
);

INSERT INTO allowed_transitions (from_state, to_state) VALUES
    (NULL, 'received'),
    ('received', 'reserved'),
    ('received', 'conflicting'),
    ('received', 'terminal_failure'),
    ('reserved', 'pending_effect'),
    ('reserved', 'effect_confirmed'),
    ('reserved', 'effect_indeterminate'),
    ('reserved', 'terminal_failure'),
    -- the retry path: a later delivery re-reserves under a higher fence
    ('pending_effect', 'reserved'),
    ('pending_effect', 'effect_confirmed'),
    ('pending_effect', 'effect_indeterminate'),
    ('pending_effect', 'terminal_failure'),
    -- indeterminate leaves only by reconciliation or an operator
    ('effect_indeterminate', 'effect_confirmed'),
    ('effect_indeterminate', 'terminal_failure'),
    ('effect_confirmed', 'ack_pending'),
    ('ack_pending', 'acknowledged');

-- +goose Down
DROP TABLE allowed_transitions;
DROP DOMAIN ackgate_state;
