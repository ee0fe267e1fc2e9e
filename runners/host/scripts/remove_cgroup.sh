#!/usr/bin/env bash
# servetune remove_cgroup: keep run directory $1's cgroup evidence in it, then remove the cgroup, trying for
# $2 tenths of a second while it is still busy (exit 1 and the pids left in it when it stays busy).
# shellcheck source=lib/cgroup.sh
. "${SERVETUNE_LIB:?}/cgroup.sh"
dir=$1 tries=$2
[ -f "$dir/cgroup" ] || exit 0
read -r _ cg < "$dir/cgroup"
if [ ! -f "$dir/cgroup_evidence" ]; then
  cg_evidence "$dir" > "$dir/cgroup_evidence.tmp" && mv "$dir/cgroup_evidence.tmp" "$dir/cgroup_evidence"
fi
n=0
while [ -d "$cg" ] && ! rmdir "$cg" 2>/dev/null; do
  n=$((n + 1))
  if [ $n -gt "$tries" ]; then
    echo "cgroup $cg still busy: $(paste -sd, - < "$cg/cgroup.procs")"
    exit 1
  fi
  sleep 0.1
done
exit 0
