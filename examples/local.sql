-- The table the example route orders-local (examples/routes.yaml) writes.
-- `make run` applies this file; it is safe to apply again.
--
-- The idempotency key is unique, so even a statement run twice by hand
-- could not record one order twice; the gateway itself never runs it twice
-- for one operation, because the row and its evidence commit together.
CREATE TABLE IF NOT EXISTS example_orders (
    id              bigserial PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    operation_id    text NOT NULL,
    body            jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
