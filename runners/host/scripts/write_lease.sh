#!/usr/bin/env bash
# servetune write_lease: write controller $2's lease into lease directory $1: the JSON text $3 (which ends in
# '"heartbeat": ') completed with the host's clock, so expiry never depends on two machines' clocks agreeing.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
umask 000
d=$(host_path "$1")
f=$d/$2.json
# The folder is shared by every local user: the text goes to a new file of a random name (mktemp, O_EXCL) that
# is renamed over the lease, so a symlink planted under either name is never followed.
mkdir -p "$d" || exit 1
chmod 1777 "$d" 2>/dev/null
[ -L "$d" ] && { echo "$d is a symlink" >&2; exit 1; }
t=$(mktemp "$d/.$2.XXXXXXXX") || exit 1
if ! { chmod 644 "$t" && printf '%s%s}\n' "$3" "$(date +%s)" >> "$t" && mv -fT "$t" "$f"; }; then
  rm -f "$t"
  exit 1
fi
