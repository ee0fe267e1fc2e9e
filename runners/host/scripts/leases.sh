#!/usr/bin/env bash
# servetune leases: the host's clock (seconds since the epoch), then every lease file in lease directory $1,
# one a line: its name, a tab, its first 4 KiB with newlines taken out.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
d=$(host_path "$1")
date +%s
for f in "$d"/*.json; do
  if [ -f "$f" ]; then printf '%s\t' "${f##*/}"; head -c 4096 "$f" | tr -d '\n\r\t'; echo; fi
done
true
