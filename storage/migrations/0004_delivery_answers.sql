-- A delivery that takes an operation's lease is written in the same commit as
-- its claim, before the gate knows what it will answer. This lets that one
-- row be answered later, once: its decision goes from '' to ack, nack or
-- reject, its reason may be filled in, and nothing else about it changes.
-- Every other row stays append-only.

-- +goose Up
ALTER TABLE deliveries ADD COLUMN owner text NOT NULL DEFAULT '';
CREATE INDEX deliveries_undecided ON deliveries (operation_id, owner) WHERE decision = '';

-- +goose StatementBegin
CREATE FUNCTION ackgate_deliveries_answer_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT 1 FROM operations WHERE id = OLD.operation_id) THEN
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.decision = '' AND NEW.decision <> ''
        AND (NEW.id, NEW.operation_id, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt,
             NEW.received_at, NEW.anomaly, NEW.trace_id, NEW.owner)
        IS NOT DISTINCT FROM
            (OLD.id, OLD.operation_id, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt,
             OLD.received_at, OLD.anomaly, OLD.trace_id, OLD.owner) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'deliveries: only an undecided delivery may be answered, once (% refused)', TG_OP
        USING ERRCODE = 'AG003';
END
$$;
-- +goose StatementEnd

DROP TRIGGER deliveries_append_only ON deliveries;
CREATE TRIGGER deliveries_answer_once BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION ackgate_deliveries_answer_once();

-- +goose Down
DROP TRIGGER deliveries_answer_once ON deliveries;
CREATE TRIGGER deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION ackgate_append_only();
DROP FUNCTION ackgate_deliveries_answer_once();
DROP INDEX deliveries_undecided;
ALTER TABLE deliveries DROP COLUMN owner;
