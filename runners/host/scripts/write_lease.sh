#!/usr/bin/env bash
# servetune write_lease: write controller $2's lease into lease directory $1: the JSON text $3 (which ends in
# '"heartbeat": ') completed with the host's clock, so expiry never depends on two machines' clocks agreeing.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
umask 000
d=$(host_path "$1")
f=$d/$2.json
mkdir -p "$d" && printf '%s%s}\n' "$3" "$(date +%s)" > "$f.tmp.$$" && mv -f "$f.tmp.$$" "$f"
