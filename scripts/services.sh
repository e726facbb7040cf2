#!/usr/bin/env bash
# Makes Postgres and Redis available on 127.0.0.1:5432 and 127.0.0.1:6379 for
# local runs and tests (Debian; run as root when something must be installed
# or started), and installs Google's Cloud Pub/Sub emulator, which the tests
# start themselves on a port of their own.
#
#   - A service that already answers is reused as it is.
#   - Otherwise missing packages are installed with apt-get and the service is
#     started directly (pg_ctlcluster, redis-server --daemonize): containers
#     have no systemd.
#   - The role and database ackgate/ackgate are created only in a local Debian
#     cluster on port 5432; a Postgres run by someone else is only checked.
#     The role may create databases and, for the tests' cleanup, end other
#     sessions in them (pg_signal_backend); it is a development role.
#
#   - The emulator (Debian package google-cloud-cli-pubsub-emulator, with a
#     JDK) comes from Google's apt repository, not Debian's. When no apt
#     source offers it, this script says so loudly and goes on: the tests
#     that need it then fail, naming the package, unless
#     ACKGATE_ALLOW_NO_PUBSUB_EMULATOR=1 is set (see docs/reliability.md).
#
# Safe to run any number of times. ACKGATE_SERVICES_WAIT bounds each readiness
# wait (seconds, default 30).
set -euo pipefail

readonly HOST=127.0.0.1
readonly PG_PORT=5432
readonly REDIS_PORT=6379
readonly DB_USER=ackgate
readonly DB_PASSWORD=ackgate
readonly DB_NAME=ackgate
readonly REDIS_DIR=/var/lib/ackgate-redis
readonly WAIT_SECONDS="${ACKGATE_SERVICES_WAIT:-30}"

apt_updated=0

log() { printf 'services: %s\n' "$*"; }
die() {
	printf 'services: error: %s\n' "$*" >&2
	exit 1
}

is_root() { [[ $(id -u) -eq 0 ]]; }
have() { command -v "$1" >/dev/null 2>&1; }

# tcp_open HOST PORT: something accepts TCP connections there.
tcp_open() {
	if have timeout; then
		timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
	else
		(exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
	fi
}

# wait_until WHAT CMD...: retry CMD once a second for at most WAIT_SECONDS.
wait_until() {
	local what=$1 i
	shift
	for ((i = 0; i < WAIT_SECONDS; i++)); do
		if "$@"; then
			return 0
		fi
		sleep 1
	done
	die "$what not ready after ${WAIT_SECONDS}s"
}

apt_install() {
	is_root || die "must run as root to install: $*"
	have apt-get || die "apt-get not found; install $* yourself"
	export DEBIAN_FRONTEND=noninteractive
	if [[ $apt_updated -eq 0 ]]; then
		log "apt-get update"
		apt-get update -qq
		apt_updated=1
	fi
	log "installing $*"
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---------------------------------------------------------------- Postgres --

pg_ready() {
	if have pg_isready; then
		pg_isready -q -h "$HOST" -p "$PG_PORT" -t 2
	else
		tcp_open "$HOST" "$PG_PORT"
	fi
}

pg_installed() {
	have pg_ctlcluster && have pg_createcluster && compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

# The local Debian cluster configured on PG_PORT, as "VERSION NAME STATUS".
local_cluster() {
	have pg_lsclusters || return 0
	pg_lsclusters --no-header 2>/dev/null | awk -v port="$PG_PORT" '$3 == port { print $1, $2, $4; exit }'
}

newest_pg_version() {
	local dir
	for dir in /usr/lib/postgresql/*/bin/postgres; do
		dir=${dir#/usr/lib/postgresql/}
		printf '%s\n' "${dir%%/*}"
	done | sort -V | tail -n 1
}

start_postgres() {
	is_root || die "Postgres is not running on $HOST:$PG_PORT and starting it needs root"
	local cluster version name status
	cluster=$(local_cluster)
	if [[ -z $cluster ]]; then
		version=$(newest_pg_version)
		[[ -n $version ]] || die "no PostgreSQL server binaries under /usr/lib/postgresql"
		name=main
		if [[ -d /etc/postgresql/$version/main ]]; then
			name=ackgate # main exists on another port; leave it alone
		fi
		log "postgres: creating cluster $version/$name on port $PG_PORT"
		pg_createcluster --port "$PG_PORT" "$version" "$name" >/dev/null
		cluster="$version $name down"
	fi
	read -r version name status <<<"$cluster"
	if [[ $status == online* ]]; then
		log "postgres: cluster $version/$name is online but not answering on $HOST:$PG_PORT; waiting"
		return 0
	fi
	log "postgres: starting cluster $version/$name"
	pg_ctlcluster "$version" "$name" start ||
		die "pg_ctlcluster $version $name start failed; see /var/log/postgresql/postgresql-$version-$name.log"
}

# psql as the postgres superuser over the local socket of our cluster.
psql_admin() {
	(cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" "$@")
}

ensure_role_and_database() {
	log "postgres: ensuring role $DB_USER and database $DB_NAME"
	# Two runs starting at once (two checkouts' tests on one machine) would
	# otherwise update the role's catalogue row together, which Postgres
	# refuses with "tuple concurrently updated": one transaction, serialized
	# by an advisory lock.
	psql_admin -d postgres <<-SQL
		BEGIN;
		DO \$\$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('ackgate services.sh')); END \$\$;
		DO \$\$
		BEGIN
		  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') THEN
		    CREATE ROLE $DB_USER;
		  END IF;
		END
		\$\$;
		ALTER ROLE $DB_USER WITH LOGIN CREATEDB PASSWORD '$DB_PASSWORD';
		-- Tests drop their databases WITH (FORCE), which must be allowed to
		-- end every session inside, an autovacuum worker's too.
		DO \$\$
		BEGIN
		  IF NOT pg_has_role('$DB_USER', 'pg_signal_backend', 'MEMBER') THEN
		    GRANT pg_signal_backend TO $DB_USER;
		  END IF;
		END
		\$\$;
		COMMIT;
	SQL
	# CREATE DATABASE cannot run inside a transaction; when another run
	# creates it first, its existence is what counts.
	if ! database_exists; then
		psql_admin -d postgres -c "CREATE DATABASE $DB_NAME OWNER $DB_USER" || database_exists ||
			die "cannot create database $DB_NAME"
	fi
}

database_exists() {
	[[ -n $(psql_admin -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'") ]]
}

check_login() {
	if ! have psql; then
		log "postgres: psql not installed; cannot check the $DB_USER login"
		return 0
	fi
	if ! PGPASSWORD=$DB_PASSWORD PGCONNECT_TIMEOUT=5 psql -X -q -h "$HOST" -p "$PG_PORT" -U "$DB_USER" -d "$DB_NAME" -tAc 'SELECT 1' >/dev/null; then
		die "cannot log in as $DB_USER to database $DB_NAME on $HOST:$PG_PORT; create them (password $DB_PASSWORD) or rerun this script as root on the machine that runs Postgres"
	fi
	log "postgres: ok (postgres://$DB_USER:***@$HOST:$PG_PORT/$DB_NAME)"
}

ensure_postgres() {
	if pg_ready; then
		log "postgres: reachable on $HOST:$PG_PORT, reusing it"
	elif tcp_open "$HOST" "$PG_PORT"; then
		log "postgres: port $PG_PORT is open; waiting for it to accept connections"
		wait_until "postgres on $HOST:$PG_PORT" pg_ready
	else
		if ! pg_installed; then
			apt_install postgresql postgresql-contrib
		fi
		# The package may have created and started a cluster already.
		if ! pg_ready; then
			start_postgres
		fi
		wait_until "postgres on $HOST:$PG_PORT" pg_ready
	fi

	local cluster
	cluster=$(local_cluster)
	if [[ $cluster == *online* ]] && is_root && have runuser; then
		ensure_role_and_database
	elif [[ -n $cluster ]]; then
		log "postgres: local cluster found, but not root; not creating role or database"
	else
		log "postgres: not a local Debian cluster; leaving roles and databases alone"
	fi
	check_login
}

# ------------------------------------------------------------------- Redis --

redis_ping() {
	local reply
	if have redis-cli; then
		reply=$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null) || return 1
	else
		# RESP by hand: send PING, expect "+PONG".
		reply=$(
			exec 2>/dev/null
			exec 3<>"/dev/tcp/$HOST/$REDIS_PORT" || exit 1
			printf 'PING\r\n' >&3
			IFS= read -r -t 2 line <&3 || exit 1
			printf '%s' "$line"
		) || return 1
		reply=${reply%$'\r'}
		reply=${reply#+}
	fi
	[[ $reply == PONG ]]
}

start_redis() {
	is_root || die "Redis is not running on $HOST:$REDIS_PORT and starting it needs root"
	mkdir -p "$REDIS_DIR"
	# No persistence: this instance is for development and tests, and the
	# gateway must cope with a Redis that forgot its counters anyway.
	local -a args=(
		--daemonize yes --bind "$HOST" --port "$REDIS_PORT"
		--dir "$REDIS_DIR" --logfile "$REDIS_DIR/redis.log" --pidfile "$REDIS_DIR/redis.pid"
		--save "" --appendonly no
	)
	log "redis: starting redis-server on $HOST:$REDIS_PORT"
	if id redis >/dev/null 2>&1 && have runuser; then
		chown redis: "$REDIS_DIR"
		(cd / && runuser -u redis -- redis-server "${args[@]}")
	else
		redis-server "${args[@]}"
	fi
}

ensure_redis() {
	if redis_ping; then
		log "redis: reachable on $HOST:$REDIS_PORT, reusing it"
		return 0
	fi
	if tcp_open "$HOST" "$REDIS_PORT"; then
		log "redis: port $REDIS_PORT is open; waiting for PONG"
	else
		if ! have redis-server; then
			apt_install redis-server
		fi
		# The package may have started one already.
		if ! redis_ping; then
			start_redis
		fi
	fi
	wait_until "redis on $HOST:$REDIS_PORT (needs to answer PING without a password)" redis_ping
	log "redis: ok (redis://$HOST:$REDIS_PORT/0)"
}

# ------------------------------------------------------ Pub/Sub emulator --

readonly EMULATOR_PACKAGE=google-cloud-cli-pubsub-emulator

# The launcher internal/emulator looks for: under the Cloud SDK gcloud belongs
# to, or a usual SDK root, or $ACKGATE_PUBSUB_EMULATOR.
emulator_launcher() {
	local root gcloud
	if [[ -n ${ACKGATE_PUBSUB_EMULATOR:-} && -x $ACKGATE_PUBSUB_EMULATOR ]]; then
		printf '%s\n' "$ACKGATE_PUBSUB_EMULATOR"
		return 0
	fi
	local -a roots=(/usr/lib/google-cloud-sdk /usr/share/google-cloud-sdk /opt/google-cloud-sdk)
	if gcloud=$(command -v gcloud 2>/dev/null); then
		roots=("$(dirname "$(dirname "$(readlink -f "$gcloud")")")" "${roots[@]}")
	fi
	for root in "${roots[@]}"; do
		if [[ -x $root/platform/pubsub-emulator/bin/cloud-pubsub-emulator ]]; then
			printf '%s\n' "$root/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
			return 0
		fi
	done
	return 1
}

# apt_offers PACKAGE: some configured apt source has a candidate for it.
apt_offers() {
	have apt-cache || return 1
	local candidate
	candidate=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2; exit }')
	[[ -n $candidate && $candidate != "(none)" ]]
}

emulator_missing() {
	printf '%s\n' \
		"services: !!! the Cloud Pub/Sub emulator is not installed, and $1." \
		"services: !!! Install $EMULATOR_PACKAGE from Google's apt repository" \
		"services: !!!   (https://cloud.google.com/sdk/docs/install#deb), then run this script again." \
		"services: !!! Until then the emulator tests fail; on a machine where the package cannot be had," \
		"services: !!! ACKGATE_ALLOW_NO_PUBSUB_EMULATOR=1 lets them pass without testing anything." >&2
}

ensure_pubsub_emulator() {
	local launcher
	if launcher=$(emulator_launcher); then
		log "pubsub emulator: found $launcher"
		return 0
	fi
	if ! is_root || ! have apt-get; then
		emulator_missing "installing it needs root and apt-get"
		return 0
	fi
	if [[ $apt_updated -eq 0 ]]; then
		log "apt-get update"
		apt-get update -qq || true
		apt_updated=1
	fi
	if ! apt_offers "$EMULATOR_PACKAGE"; then
		emulator_missing "no configured apt source offers $EMULATOR_PACKAGE"
		return 0
	fi
	apt_install "$EMULATOR_PACKAGE"
	launcher=$(emulator_launcher) || die "$EMULATOR_PACKAGE was installed, but no cloud-pubsub-emulator launcher was found"
	log "pubsub emulator: installed $launcher"
}

ensure_postgres
ensure_redis
ensure_pubsub_emulator
