#!/usr/bin/env bash
# Makes a headless-capable Chromium available for the operator console's
# browser test (console/browser_test.go), which drives it over the DevTools
# protocol. Debian's `chromium` package; run as root when it must be installed.
#
#   - A Chromium already on PATH is reused as it is.
#   - Otherwise the package is installed with apt-get (no browser download of
#     its own: the package carries the binary).
#
# Safe to run any number of times. The test looks for the binary itself and
# fails, naming this script, when it finds none.
set -euo pipefail

log() { printf 'chromium: %s\n' "$*"; }
die() {
	printf 'chromium: error: %s\n' "$*" >&2
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

for bin in chromium chromium-browser google-chrome-stable google-chrome headless-shell; do
	if have "$bin"; then
		log "found $(command -v "$bin"), reusing it"
		exit 0
	fi
done

[[ $(id -u) -eq 0 ]] || die "Chromium is not installed and installing it needs root (apt-get install chromium)"
have apt-get || die "apt-get not found; install Chromium yourself"
export DEBIAN_FRONTEND=noninteractive
log "apt-get update"
apt-get update -qq
log "installing chromium"
apt-get install -y -qq --no-install-recommends chromium >/dev/null
have chromium || die "chromium was installed but is not on PATH"
log "ok ($(chromium --version 2>/dev/null || echo 'version unknown'))"
