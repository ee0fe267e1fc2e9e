#!/usr/bin/env bash
# servetune orphans: the servers under runs root $1 that host $2 started and that still run without an exit
# code, as "pgid run_dir controller run_id" lines ("-" for a run that names no controller).
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
# shellcheck source=lib/group.sh
. "${SERVETUNE_LIB:?}/group.sh"
root=$(host_path "$1")
for d in "$root"/*/*/; do
  if [ ! -f "$d/pgid" ] || [ -f "$d/exit_code" ]; then continue; fi
  [ "$(head -1 "$d/owner" 2>/dev/null)" = "$2" ] || continue
  pg=$(cat "$d/pgid"); id=$(sed -n 2p "$d/owner"); c=$(sed -n 3p "$d/owner")
  if [ -n "$(members "$pg")" ]; then echo "$pg ${d%/} ${c:--} $id"; fi
done
true
