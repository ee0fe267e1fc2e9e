#!/usr/bin/env bash
# servetune leases: the host's clock (seconds since the epoch), then every lease in lease directory $1, one
# JSON object a line.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
d=$(host_path "$1")
date +%s
for f in "$d"/*.json; do
  if [ -f "$f" ]; then tr -d '\n' < "$f"; echo; fi
done
true
