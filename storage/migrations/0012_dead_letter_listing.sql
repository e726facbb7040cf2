-- GET /v1/dead-letters pages through terminal records, terminal_failure
-- operations and conflict records, newest first, with or without a route.
-- operations_open_by_state (0008) covers terminal_failure but not conflict
-- records, and is led by state, so listing both kinds in one order would
-- sort them all. These partial indexes hold only terminal rows, in the
-- listing's order; the hot path's updates never enter them (its rows are
-- open), and a redelivery of terminal work changes no column they hold.

-- +goose Up
CREATE INDEX operations_terminal_created ON operations (created_at, id)
    WHERE state IN ('terminal_failure', 'conflicting');
CREATE INDEX operations_terminal_route_created ON operations (route, created_at, id)
    WHERE state IN ('terminal_failure', 'conflicting');

-- +goose Down
DROP INDEX operations_terminal_route_created;
DROP INDEX operations_terminal_created;
