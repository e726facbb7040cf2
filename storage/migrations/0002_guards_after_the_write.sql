-- The guards that compare a row's old and new values run after the row is
-- written instead of before. Postgres locks a row before it runs any BEFORE
-- UPDATE row trigger, whatever the trigger's WHEN clause says, and logs
-- that lock: on the common path that was a tuple lock and a WAL record for
-- every evidence and ack mark. An AFTER trigger reads the old row without
-- locking it, and its WHEN clause, false on every legal write, queues
-- nothing; an illegal write still fails its statement with the same error.

-- +goose Up
-- +goose StatementBegin
DROP TRIGGER operations_identity_fixed ON operations;
CREATE TRIGGER operations_identity_fixed AFTER UPDATE OF seq, id, created_at, route, tenant, key_source, key,
        scope_key, fingerprint, fingerprint_version, conflict_of, shape, idempotency_key, trace_id, broker, source,
        message_id, broker_attempt, publish_time ON operations FOR EACH ROW
    WHEN ((NEW.seq, NEW.id, NEW.created_at, NEW.route, NEW.tenant, NEW.key_source, NEW.key, NEW.scope_key,
           NEW.fingerprint, NEW.fingerprint_version, NEW.conflict_of, NEW.shape, NEW.idempotency_key,
           NEW.trace_id, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt, NEW.publish_time)
          IS DISTINCT FROM
          (OLD.seq, OLD.id, OLD.created_at, OLD.route, OLD.tenant, OLD.key_source, OLD.key, OLD.scope_key,
           OLD.fingerprint, OLD.fingerprint_version, OLD.conflict_of, OLD.shape, OLD.idempotency_key,
           OLD.trace_id, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt, OLD.publish_time))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'an operation''s identity and first delivery are fixed');

DROP TRIGGER operations_fence_rises ON operations;
CREATE TRIGGER operations_fence_rises AFTER UPDATE OF fence, log_count, delivery_count, attempt_count
        ON operations FOR EACH ROW
    WHEN (NEW.fence < OLD.fence OR (NEW.fence <> OLD.fence AND NEW.log_count = 0)
          OR NEW.log_count < OLD.log_count OR NEW.delivery_count < OLD.delivery_count
          OR NEW.attempt_count < OLD.attempt_count)
    EXECUTE FUNCTION ackgate_refuse('AG002', 'fences and counts only rise, and a new fence is logged');

DROP TRIGGER operations_history_kept ON operations;
CREATE TRIGGER operations_history_kept AFTER UPDATE ON operations FOR EACH ROW
    WHEN ((OLD.evidence_at IS NOT NULL AND (NEW.evidence_at, NEW.result_id) IS DISTINCT FROM (OLD.evidence_at, OLD.result_id))
          OR (OLD.acked_at IS NOT NULL AND NEW.acked_at IS DISTINCT FROM OLD.acked_at)
          OR (OLD.d1_decision <> '' AND (NEW.d1_decision, NEW.d1_reason, NEW.d1_anomaly)
              IS DISTINCT FROM (OLD.d1_decision, OLD.d1_reason, OLD.d1_anomaly))
          OR (OLD.a1_started_at IS NOT NULL AND (NEW.a1_fence, NEW.a1_contract, NEW.a1_started_at)
              IS DISTINCT FROM (OLD.a1_fence, OLD.a1_contract, OLD.a1_started_at))
          OR (OLD.a1_finished_at IS NOT NULL AND (NEW.a1_finished_at, NEW.a1_outcome, NEW.a1_status, NEW.a1_result_id, NEW.a1_reason)
              IS DISTINCT FROM (OLD.a1_finished_at, OLD.a1_outcome, OLD.a1_status, OLD.a1_result_id, OLD.a1_reason)))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'evidence, the ack, the first delivery''s answer and the first attempt are written once');

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

DROP TRIGGER operations_state_moves_with_its_log ON operations;
CREATE TRIGGER operations_state_moves_with_its_log AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state <> OLD.state AND NEW.log_count = OLD.log_count AND NOT (OLD.log_count = 0 AND (
        (OLD.state = 'pending_effect' AND NEW.state = 'ack_pending')
        OR (OLD.state = 'ack_pending' AND NEW.state = 'acknowledged'))))
    EXECUTE FUNCTION ackgate_refuse('AG004', 'a move off the common path is logged');

DROP TRIGGER deliveries_answered_once ON deliveries;
CREATE TRIGGER deliveries_answered_once AFTER UPDATE ON deliveries FOR EACH ROW
    WHEN ((NEW.operation_id, NEW.n, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt,
           NEW.received_at, NEW.publish_time, NEW.trace_id, NEW.found)
          IS DISTINCT FROM
          (OLD.operation_id, OLD.n, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt,
           OLD.received_at, OLD.publish_time, OLD.trace_id, OLD.found)
          OR (OLD.decision <> '' AND (NEW.decision, NEW.reason, NEW.anomaly) IS DISTINCT FROM (OLD.decision, OLD.reason, OLD.anomaly))
          OR (OLD.fence <> 0 AND NEW.fence <> OLD.fence))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'a delivery is answered once and marked with one fence');

DROP TRIGGER attempts_finished_once ON attempts;
CREATE TRIGGER attempts_finished_once AFTER UPDATE ON attempts FOR EACH ROW
    WHEN ((NEW.operation_id, NEW.n, NEW.kind, NEW.fence, NEW.contract_version, NEW.started_at)
          IS DISTINCT FROM (OLD.operation_id, OLD.n, OLD.kind, OLD.fence, OLD.contract_version, OLD.started_at)
          OR OLD.finished_at IS NOT NULL)
    EXECUTE FUNCTION ackgate_refuse('AG003', 'an attempt is finished once');
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER operations_identity_fixed ON operations;
CREATE TRIGGER operations_identity_fixed BEFORE UPDATE OF seq, id, created_at, route, tenant, key_source, key,
        scope_key, fingerprint, fingerprint_version, conflict_of, shape, idempotency_key, trace_id, broker, source,
        message_id, broker_attempt, publish_time ON operations FOR EACH ROW
    WHEN ((NEW.seq, NEW.id, NEW.created_at, NEW.route, NEW.tenant, NEW.key_source, NEW.key, NEW.scope_key,
           NEW.fingerprint, NEW.fingerprint_version, NEW.conflict_of, NEW.shape, NEW.idempotency_key,
           NEW.trace_id, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt, NEW.publish_time)
          IS DISTINCT FROM
          (OLD.seq, OLD.id, OLD.created_at, OLD.route, OLD.tenant, OLD.key_source, OLD.key, OLD.scope_key,
           OLD.fingerprint, OLD.fingerprint_version, OLD.conflict_of, OLD.shape, OLD.idempotency_key,
           OLD.trace_id, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt, OLD.publish_time))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'an operation''s identity and first delivery are fixed');

DROP TRIGGER operations_fence_rises ON operations;
CREATE TRIGGER operations_fence_rises BEFORE UPDATE OF fence, log_count, delivery_count, attempt_count
        ON operations FOR EACH ROW
    WHEN (NEW.fence < OLD.fence OR (NEW.fence <> OLD.fence AND NEW.log_count = 0)
          OR NEW.log_count < OLD.log_count OR NEW.delivery_count < OLD.delivery_count
          OR NEW.attempt_count < OLD.attempt_count)
    EXECUTE FUNCTION ackgate_refuse('AG002', 'fences and counts only rise, and a new fence is logged');

DROP TRIGGER operations_history_kept ON operations;
CREATE TRIGGER operations_history_kept BEFORE UPDATE ON operations FOR EACH ROW
    WHEN ((OLD.evidence_at IS NOT NULL AND (NEW.evidence_at, NEW.result_id) IS DISTINCT FROM (OLD.evidence_at, OLD.result_id))
          OR (OLD.acked_at IS NOT NULL AND NEW.acked_at IS DISTINCT FROM OLD.acked_at)
          OR (OLD.d1_decision <> '' AND (NEW.d1_decision, NEW.d1_reason, NEW.d1_anomaly)
              IS DISTINCT FROM (OLD.d1_decision, OLD.d1_reason, OLD.d1_anomaly))
          OR (OLD.a1_started_at IS NOT NULL AND (NEW.a1_fence, NEW.a1_contract, NEW.a1_started_at)
              IS DISTINCT FROM (OLD.a1_fence, OLD.a1_contract, OLD.a1_started_at))
          OR (OLD.a1_finished_at IS NOT NULL AND (NEW.a1_finished_at, NEW.a1_outcome, NEW.a1_status, NEW.a1_result_id, NEW.a1_reason)
              IS DISTINCT FROM (OLD.a1_finished_at, OLD.a1_outcome, OLD.a1_status, OLD.a1_result_id, OLD.a1_reason)))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'evidence, the ack, the first delivery''s answer and the first attempt are written once');

DROP TRIGGER operations_transitions_follow_the_table ON operations;
CREATE TRIGGER operations_transitions_follow_the_table BEFORE UPDATE OF state ON operations FOR EACH ROW
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

DROP TRIGGER operations_state_moves_with_its_log ON operations;
CREATE TRIGGER operations_state_moves_with_its_log BEFORE UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state <> OLD.state AND NEW.log_count = OLD.log_count AND NOT (OLD.log_count = 0 AND (
        (OLD.state = 'pending_effect' AND NEW.state = 'ack_pending')
        OR (OLD.state = 'ack_pending' AND NEW.state = 'acknowledged'))))
    EXECUTE FUNCTION ackgate_refuse('AG004', 'a move off the common path is logged');

DROP TRIGGER deliveries_answered_once ON deliveries;
CREATE TRIGGER deliveries_answered_once BEFORE UPDATE ON deliveries FOR EACH ROW
    WHEN ((NEW.operation_id, NEW.n, NEW.broker, NEW.source, NEW.message_id, NEW.broker_attempt,
           NEW.received_at, NEW.publish_time, NEW.trace_id, NEW.found)
          IS DISTINCT FROM
          (OLD.operation_id, OLD.n, OLD.broker, OLD.source, OLD.message_id, OLD.broker_attempt,
           OLD.received_at, OLD.publish_time, OLD.trace_id, OLD.found)
          OR (OLD.decision <> '' AND (NEW.decision, NEW.reason, NEW.anomaly) IS DISTINCT FROM (OLD.decision, OLD.reason, OLD.anomaly))
          OR (OLD.fence <> 0 AND NEW.fence <> OLD.fence))
    EXECUTE FUNCTION ackgate_refuse('AG003', 'a delivery is answered once and marked with one fence');

DROP TRIGGER attempts_finished_once ON attempts;
CREATE TRIGGER attempts_finished_once BEFORE UPDATE ON attempts FOR EACH ROW
    WHEN ((NEW.operation_id, NEW.n, NEW.kind, NEW.fence, NEW.contract_version, NEW.started_at)
          IS DISTINCT FROM (OLD.operation_id, OLD.n, OLD.kind, OLD.fence, OLD.contract_version, OLD.started_at)
          OR OLD.finished_at IS NOT NULL)
    EXECUTE FUNCTION ackgate_refuse('AG003', 'an attempt is finished once');
-- +goose StatementEnd
