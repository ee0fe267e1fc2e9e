#!/usr/bin/env bash
# servetune claim: in the GPU set's folder $1 (see host_dir.sh), take the claim for controller $2 unless one
# of the live controllers $4... holds it, or waits for it ahead of $2. Waiting controllers queue, first come,
# first served: a ticket "SEQ+CONTROLLER" in queue/, touched at each try; a ticket of a controller that is
# not live, or not touched for $3 seconds, is dropped. A claim of any controller not live is stale and taken
# over. Prints "ok", "held CONTROLLER" or "queued CONTROLLER" (the first in line). Under flock where the
# host has it.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
umask 000
d=$(host_path "$1") me=$2 stale=$3
shift 3
claim=$d/claim queue=$d/queue
mkdir -p "$queue" || exit 1
is_live() {  # $1: a controller; the rest: the live controllers
  local c=$1 k
  shift
  for k in "$@"; do [ "$c" = "$k" ] && return 0; done
  return 1
}
enqueue() {  # keep (touch) this controller's ticket, or take a new one at the end of the line
  local t n
  for t in "$queue"/*+"$me"; do
    if [ -f "$t" ]; then touch "$t"; return; fi
  done
  n=$(head -c 20 "$d/tickets" 2>/dev/null)
  case $n in ''|*[!0-9]*) n=0 ;; esac
  n=$((n + 1))
  echo "$n" > "$d/tickets"
  : > "$queue/$(printf '%012d' "$n")+$me"
}
take() {  # $@: the live controllers
  local c t holder first="" now
  now=$(date +%s)
  for t in "$queue"/*; do
    [ -f "$t" ] || continue
    c=${t##*+}
    if [ "$c" != "$me" ] && { ! is_live "$c" "$@" || [ $((now - $(stat -c %Y "$t"))) -gt "$stale" ]; }; then
      rm -f "$t"
    elif [ -z "$first" ]; then
      first=$c
    fi
  done
  holder=$(head -c 300 "$claim/controller" 2>/dev/null)
  if [ -d "$claim" ] && [ "$holder" = "$me" ]; then echo ok; return; fi
  if [ -d "$claim" ] && is_live "$holder" "$@"; then enqueue; echo "held $holder"; return; fi
  if [ -n "$first" ] && [ "$first" != "$me" ]; then enqueue; echo "queued $first"; return; fi
  rm -rf "$claim"
  mkdir "$claim" || { echo "held ?"; return; }
  echo "$me" > "$claim/controller"
  rm -f "$queue/"*"+$me"
  echo ok
}
if command -v flock > /dev/null; then
  ( flock 9; take "$@" ) 9>> "$d/claim.lock"
else
  take "$@"
fi
