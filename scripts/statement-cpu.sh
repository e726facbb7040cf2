#!/usr/bin/env bash
# What one write to operations costs the Postgres backend, guards
# included, with no round trip and no gateway: each statement runs in a
# loop inside the server (a DO block, one commit per run) and the backend's
# CPU time is read from /proc before and after.
#
# The ledger's guards (CHECK constraints, trigger WHEN clauses) are priced
# per statement, not per row, so this is how a change to them is measured:
# give one gateway binary per schema to compare, and the runs of each are
# interleaved, so the machine's neighbours weigh on all of them alike.
#
#   scripts/statement-cpu.sh [rounds] gateway-binary...   (run as root)
#
#   e.g. git worktree add /tmp/before HEAD~1 && (cd /tmp/before && go build -o /tmp/gw-before ./cmd/gateway)
#        make build && scripts/statement-cpu.sh 6 /tmp/gw-before bin/gateway
#
# It needs the local Debian cluster of scripts/services.sh (it reads
# /proc/<backend>/stat through pg_read_file, as the postgres superuser).
# Each binary migrates a database of its own, dropped at the end. Printed
# per binary and statement: µs of backend CPU per statement, the median and
# the best of the rounds, and the "no triggers" line: the same UPDATE with
# the binary's triggers dropped, to show what they cost.
set -euo pipefail

rounds=6
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
	rounds=$1
	shift
fi
(($# > 0)) || { echo "usage: $0 [rounds] gateway-binary..." >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "statement-cpu: run as root (reads /proc as postgres)" >&2; exit 1; }
readonly N=4000

psql_admin() { (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 "$@"); }

dbs=()
trap 'for d in "${dbs[@]}"; do psql_admin -d postgres -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null; done' EXIT

readonly row="created_at, retain_until, fingerprint_version, id, route, tenant, key_source, key, scope_key,
	fingerprint, shape, dead_letter_policy, contract_version, idempotency_key, broker, source, message_id, fence,
	state, updated_at"
readonly values="now(), now() + interval '1 day', 1, %s, 'r', 't', 'message_id', 'k', 's', 'f', 'idempotent',
	'broker', 'c1', 'ik', 'pubsub', 's', 'm', 1, 'pending_effect', now()"
# The evidence's and the ack's kind of write: it sets state and the columns
# the guards watch, to the values they hold.
readonly update="UPDATE operations SET state = state, a1_outcome = a1_outcome, d1_decision = d1_decision,
	log_count = log_count, updated_at = now() WHERE id = 'p'"
# printf-style: the id of each inserted operation.
readonly insert="INSERT INTO operations ($row) VALUES ($(printf "$values" "'i' || i || '-' || clock_timestamp()"))"

# loop prints µs of backend CPU per run of statement $2 in database $1.
loop() {
	psql_admin -d "$1" -tA <<SQL
SET synchronous_commit = off;
CREATE TEMP TABLE t0 AS SELECT split_part(pg_read_file('/proc/' || pg_backend_pid() || '/stat'), ') ', 2) AS s;
DO \$\$ BEGIN FOR i IN 1..$N LOOP $2; COMMIT; END LOOP; END \$\$;
WITH now AS (SELECT split_part(pg_read_file('/proc/' || pg_backend_pid() || '/stat'), ') ', 2) AS s)
SELECT round(((split_part(now.s, ' ', 12)::bigint + split_part(now.s, ' ', 13)::bigint)
	- (split_part(t0.s, ' ', 12)::bigint + split_part(t0.s, ' ', 13)::bigint)) * 1e6 / 100 / $N, 1)
FROM now, t0;
SQL
}

names=()
for bin in "$@"; do
	db=statement_cpu_$$_${#dbs[@]}
	psql_admin -d postgres -c "CREATE DATABASE $db OWNER ackgate" >/dev/null
	dbs+=("$db")
	GATEWAY_DATABASE_URL="postgres://ackgate:ackgate@127.0.0.1:5432/$db?sslmode=disable" \
		GATEWAY_REDIS_URL=redis://127.0.0.1:6379/0 "$bin" migrate >/dev/null
	psql_admin -d "$db" -c "INSERT INTO operations ($row) VALUES ($(printf "$values" "'p'"))" >/dev/null
	# The same schema without its triggers, for their share.
	psql_admin -d postgres -c "CREATE DATABASE ${db}_nt TEMPLATE $db" >/dev/null
	dbs+=("${db}_nt")
	psql_admin -d "${db}_nt" -c "DO \$\$ DECLARE r record; BEGIN
		FOR r IN SELECT tgname FROM pg_trigger WHERE tgrelid = 'operations'::regclass AND NOT tgisinternal LOOP
			EXECUTE format('DROP TRIGGER %I ON operations', r.tgname); END LOOP; END \$\$" >/dev/null
	names+=("$bin")
done

results=$(mktemp)
trap 'rm -f "$results"; for d in "${dbs[@]}"; do psql_admin -d postgres -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null; done' EXIT
for ((r = 0; r < rounds; r++)); do
	for i in "${!names[@]}"; do
		db=statement_cpu_$$_$((2 * i))
		echo "$i update $(loop "$db" "$update")" >>"$results"
		echo "$i insert $(loop "$db" "$insert")" >>"$results"
		echo "$i update-no-triggers $(loop "${db}_nt" "$update")" >>"$results"
	done
done
for i in "${!names[@]}"; do
	for kind in update insert update-no-triggers; do
		awk -v i="$i" -v k="$kind" '$1 == i && $2 == k { print $3 }' "$results" | sort -n |
			awk -v name="${names[$i]}" -v k="$kind" '{ v[NR] = $1 } END {
				m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
				printf "%-40s %-20s median %7.1f us  best %7.1f us  (%d runs)\n", name, k, m, v[1], NR }'
	done
done
