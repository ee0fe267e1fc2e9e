#!/usr/bin/env bash
# servetune claim: take claim directory $1 for controller $2 unless one of the live controllers $3... holds it
# (a claim of any other controller is stale and taken over). Prints "ok" or "held CONTROLLER". The
# directory is made atomically, under flock where the host has it.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
claim=$(host_path "$1") me=$2
shift 2
mkdir -p "$(dirname "$claim")" || exit 1
take() {  # $@: the live controllers whose claim stands
  local c k
  if ! mkdir "$claim" 2>/dev/null; then
    c=$(cat "$claim/controller" 2>/dev/null)
    if [ "$c" = "$me" ]; then echo ok; return; fi
    for k in "$@"; do
      if [ "$c" = "$k" ]; then echo "held $c"; return; fi
    done
    rm -rf "$claim"
    mkdir "$claim" || { echo "held ?"; return; }
  fi
  echo "$me" > "$claim/controller"
  echo ok
}
if command -v flock > /dev/null; then
  ( flock 9; take "$@" ) 9> "$claim.lock"
else
  take "$@"
fi
