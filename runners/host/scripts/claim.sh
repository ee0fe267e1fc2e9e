#!/usr/bin/env bash
# servetune claim: in the GPU set's folder $1 (see host_dir.sh), take the claim for controller $2 unless one
# of the live controllers $4... holds it, or waits for it ahead of $2. Waiting controllers queue, first come,
# first served: a ticket "SEQ+CONTROLLER" in queue/, touched at each try; a ticket of a controller that is
# not live, or not touched for $3 seconds, is dropped. A claim of any controller not live is stale and taken
# over. Prints "ok", "held CONTROLLER" or "queued CONTROLLER" (the first in line). Under flock where the
# host has it, waiting at most $4 seconds for the lock: when another process holds it longer (a hung or
# foreign process), prints "locked PID COMMAND" (the holder as /proc/locks names it; "locked ? ?" when it
# cannot be seen, e.g. from another PID namespace) and takes nothing. The folder is shared by every local user:
# nothing here follows a symlink another user planted (a file is made with noclobber, O_EXCL, or not at all; the
# lock is opened read-only and only when it is a plain file), so a controller running as root writes nowhere else.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
umask 000
set -o noclobber
d=$(host_path "$1") me=$2 stale=$3 wait=$4
shift 4
claim=$d/claim queue=$d/queue
mkdir -p "$queue" || exit 1
if [ -L "$d" ] || [ -L "$queue" ] || [ ! -d "$queue" ]; then echo "$d or its queue is not a folder (a symlink?)" >&2; exit 1; fi
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
  n=0  # the next ticket follows the last one in line (under the lock): no counter file to be planted
  for t in "$queue"/*+*; do
    t=${t##*/} t=${t%%+*}
    case $t in ''|*[!0-9]*) ;; *) [ $((10#$t)) -gt "$n" ] && n=$((10#$t)) ;; esac
  done
  n=$((n + 1))
  : 2>/dev/null > "$queue/$(printf '%012d' "$n")+$me"
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
  holder=""
  [ -L "$claim/controller" ] || holder=$(head -c 300 "$claim/controller" 2>/dev/null)
  if [ -d "$claim" ] && [ "$holder" = "$me" ]; then echo ok; return; fi
  if [ -d "$claim" ] && is_live "$holder" "$@"; then enqueue; echo "held $holder"; return; fi
  if [ -n "$first" ] && [ "$first" != "$me" ]; then enqueue; echo "queued $first"; return; fi
  # The stale claim goes; in the sticky folder another user's claim folder stays (world-writable, not sticky) and
  # only its file is made anew.
  rm -rf "$claim" 2>/dev/null
  mkdir "$claim" 2>/dev/null
  if [ -L "$claim" ] || [ ! -d "$claim" ]; then echo "held ?"; return; fi
  rm -f "$claim/controller" 2>/dev/null
  echo "$me" 2>/dev/null > "$claim/controller" || { echo "held ?"; return; }
  rm -f "$queue/"*"+$me"
  echo ok
}
lockfile=$d/claim.lock
lock_holder() {  # prints "PID COMMAND" of a process holding a lock on $lockfile
  local dev ino key pid comm
  read -r dev ino < <(stat -c '%d %i' "$lockfile" 2>/dev/null) || { echo "? ?"; return; }
  # /proc/locks names a file as MAJOR:MINOR:INODE, major and minor in hex (fs/locks.c, lock_get_status)
  key=$(printf '%02x:%02x:%s' $(((dev >> 8) & 0xfff)) $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")
  pid=$(awk -v key="$key" '$2 != "->" && $6 == key && $5 > 0 { print $5; exit }' /proc/locks 2>/dev/null)
  case $pid in ''|*[!0-9]*) echo "? ?"; return ;; esac
  comm=$(head -c 64 "/proc/$pid/comm" 2>/dev/null | tr -c 'A-Za-z0-9._+-' '_' | sed 's/_$//')
  echo "$pid ${comm:-?}"
}
: 2>/dev/null > "$lockfile"  # made here unless it is there (noclobber: never through a symlink)
if [ -L "$lockfile" ] || [ ! -f "$lockfile" ]; then
  echo "$lockfile is not a plain file (a symlink?): remove it" >&2
  exit 1
fi
if command -v flock > /dev/null; then
  ( if flock -w "$wait" 9; then take "$@"; else echo "locked $(lock_holder)"; fi ) 9< "$lockfile"
else
  take "$@"
fi
