#!/usr/bin/env bash
# servetune foreign_pids: of the pids $2..., those that are not in process group or session $1 (processes this
# PID namespace cannot see count as foreign), one a line.
pg=$1
shift
for p in "$@"; do
  case $p in ''|*[!0-9]*) continue ;; esac
  read -r -a f < <(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null)
  if [ "${f[2]:-}" != "$pg" ] && [ "${f[3]:-}" != "$pg" ]; then echo "$p"; fi
done
true
