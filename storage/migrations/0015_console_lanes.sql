-- The operator console's lanes, read a page at a time, oldest first.
--
-- Without a route, a lane is walked on operations_open_by_state (0008),
-- except conflicts, which that index leaves out: conflict records are
-- never open work, but an operator still looks at them. With a route, the
-- open-state index would walk every route's entries of the state to find
-- one route's, so the lanes get an index that begins with the route.
--
-- Both are partial: only operations that stopped short of an ack are in
-- them, so they stay the size of the lanes, and a delivery that goes
-- straight to acknowledged never writes an entry into either.

-- +goose Up
CREATE INDEX operations_conflicts_created ON operations (created_at, id)
    WHERE state = 'conflicting';
CREATE INDEX operations_lanes_by_route ON operations (route, state, created_at, id)
    WHERE state IN ('effect_indeterminate', 'terminal_failure', 'conflicting');

-- +goose Down
DROP INDEX operations_lanes_by_route;
DROP INDEX operations_conflicts_created;
