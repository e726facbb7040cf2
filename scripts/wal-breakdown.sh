#!/usr/bin/env bash
# Where a message's WAL goes, record by record, for ackgate and the bare
# two-statement op side by side.
#
# loadgen reports WAL bytes per message as one number; this reads the WAL
# itself (pg_walinspect, in Postgres' contrib) between two LSNs around a
# loadgen run of op and ackgate, and groups the records by relation and by
# record type, per message of each system. It is what docs/performance.md's
# tables of WAL by relation come from.
#
#   scripts/wal-breakdown.sh [messages]      (default 3000; run as root)
#
# It needs the local Debian cluster of scripts/services.sh (it reads the WAL
# as the postgres superuser) and the binaries of `make build`. The run's
# database is dropped at the end. Catalogue records (the run's own CREATE
# DATABASE and migrations) and full-page images are shown apart: the first
# are not per message, the second depend on when the last checkpoint was.
set -euo pipefail

readonly N="${1:-3000}"
readonly PG_PORT=5432

cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "wal-breakdown: run as root (reads WAL as postgres)" >&2; exit 1; }
[[ -x bin/loadgen && -x bin/gateway ]] || { echo "wal-breakdown: run make build first" >&2; exit 1; }

psql_admin() { (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" "$@"); }

# A slot keeps the run's WAL from being recycled by a checkpoint before it
# is read.
slot=wal_breakdown_$$
psql_admin -d postgres -tAc "SELECT 1 FROM pg_create_physical_replication_slot('$slot', true)" >/dev/null
out=$(mktemp)
trap 'rm -f "$out"; psql_admin -d postgres -tAc "SELECT pg_drop_replication_slot('"'"'$slot'"'"')" >/dev/null' EXIT
start=$(psql_admin -d postgres -tAc 'SELECT pg_current_wal_lsn()')
bin/loadgen -gateway-bin bin/gateway -systems op,ackgate -n "$N" -n1 0 -mem-n 0 -handoff-n 0 -keep-db -quiet >"$out" 2>&1 ||
	{ cat "$out" >&2; exit 1; }
end=$(psql_admin -d postgres -tAc 'SELECT pg_current_wal_lsn()')
db=$(grep -o 'ackgate_loadgen_[0-9a-f]*' "$out" | head -1)
[[ -n $db ]] || { cat "$out" >&2; echo "wal-breakdown: no database name in loadgen's output" >&2; exit 1; }
trap 'rm -f "$out"; psql_admin -d postgres -tAc "SELECT pg_drop_replication_slot('"'"'$slot'"'"')" >/dev/null
	psql_admin -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null' EXIT

echo "WAL between $start and $end; database $db; $N messages per system plus warm-up"
psql_admin -d "$db" -P pager=off <<SQL
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_walinspect;
CREATE TEMP TABLE w AS
SELECT r.record_type AS rt, r.record_length AS len, r.fpi_length AS fpi,
       (regexp_match(r.block_ref, 'rel \d+/(\d+)/(\d+)'))[1]::oid AS db,
       (regexp_match(r.block_ref, 'rel \d+/(\d+)/(\d+)'))[2]::oid AS rfn,
       r.resource_manager AS rm
FROM pg_get_wal_records_info('$start', '$end') r;

-- Each relation of a system, per message of that system: op's rows are in
-- loadgen_op, ackgate's operations are its messages.
CREATE TEMP TABLE sys AS
SELECT c.relfilenode, c.relname,
       CASE WHEN c.relname LIKE 'loadgen_op%' THEN 'op' ELSE 'ackgate' END AS system
FROM pg_class c
WHERE c.relname LIKE 'loadgen_op%'
   OR c.relname ~ '^(operations|transitions|deliveries|attempts|dead_letters|outbox)(_|$)';
CREATE TEMP TABLE msgs AS
SELECT 'op' AS system, (SELECT count(*) FROM loadgen_op) AS n
UNION ALL SELECT 'ackgate', (SELECT count(*) FROM operations);

\echo
\echo '== by relation, bytes of WAL records per message (full-page images apart) =='
SELECT s.system, s.relname, round(count(*)::numeric / m.n, 2) AS records_per_msg,
       round(sum(w.len - w.fpi)::numeric / m.n) AS bytes_per_msg, sum(w.fpi) AS fpi_bytes_total
FROM w JOIN sys s ON s.relfilenode = w.rfn JOIN msgs m USING (system)
WHERE w.db = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY s.system, s.relname, m.n
ORDER BY s.system DESC, bytes_per_msg DESC;

\echo
\echo '== by table and record type, per message =='
SELECT s.system, regexp_replace(s.relname, '_(pkey|[a-z_]+)$', '') AS "table", s.relname, w.rt AS record,
       round(count(*)::numeric / m.n, 2) AS per_msg, round(avg(w.len - w.fpi)) AS avg_bytes,
       round(sum(w.len - w.fpi)::numeric / m.n) AS bytes_per_msg
FROM w JOIN sys s ON s.relfilenode = w.rfn JOIN msgs m USING (system)
WHERE w.db = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY s.system, s.relname, w.rt, m.n
HAVING count(*)::numeric / m.n >= 0.05
ORDER BY s.system DESC, s.relname, bytes_per_msg DESC;

\echo
\echo '== the rest of the range, not per message: other relations, and records without a block =='
SELECT coalesce(CASE WHEN w.rfn IS NULL THEN w.rm || ' ' || w.rt END, 'catalogue and other relations') AS what,
       count(*) AS records, sum(w.len - w.fpi) AS bytes, sum(w.fpi) AS fpi_bytes
FROM w LEFT JOIN sys s ON s.relfilenode = w.rfn
  AND w.db = (SELECT oid FROM pg_database WHERE datname = current_database())
WHERE s.relname IS NULL
GROUP BY 1 ORDER BY bytes DESC LIMIT 12;
SQL
