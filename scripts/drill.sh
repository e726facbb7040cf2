#!/usr/bin/env bash
# Installs what the failover drill runs (Debian packages patroni and
# etcd-server; redis-server and postgresql come from scripts/services.sh)
# and runs bin/drill with the arguments given. `make drill` calls it; see
# cmd/drill for the stages and docs/reliability.md for a run's figures.
#
# The drill needs root: Postgres runs as the postgres user, and one stage
# puts a gateway in a network namespace.
set -euo pipefail

log() { printf 'drill: %s\n' "$*"; }
die() {
	printf 'drill: error: %s\n' "$*" >&2
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

[[ $(id -u) -eq 0 ]] || die "the drill needs root (Postgres as the postgres user, a network namespace)"
have ip || die "iproute2 (ip) is needed for the partition stage"

missing=()
have patroni || missing+=(patroni)
have etcd || missing+=(etcd-server)
have redis-cli || missing+=(redis-tools)
if ((${#missing[@]} > 0)); then
	have apt-get || die "install ${missing[*]} yourself"
	export DEBIAN_FRONTEND=noninteractive
	log "apt-get update"
	apt-get update -qq
	log "installing ${missing[*]}"
	# The packages' own services stay stopped: the drill runs its own.
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

bin=${1:?usage: drill.sh BIN_DIR [drill flags]}
shift
exec "$bin/drill" -gateway "$bin/gateway" "$@"
