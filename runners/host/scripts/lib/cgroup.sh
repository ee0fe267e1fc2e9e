# shellcheck shell=bash
# Prints the memory cgroup evidence of run directory $1 as "key value" lines (nothing for a run without a
# cgroup): the copy remove_cgroup.sh kept, else the live cgroup's counters (v2 memory.events, v1 files).
cg_evidence() {
  local v d
  if [ -f "$1/cgroup_evidence" ]; then cat "$1/cgroup_evidence"; return 0; fi
  read -r v d < "$1/cgroup" 2>/dev/null || return 0
  echo "cgroup_version $v"
  echo "cgroup $d"
  [ -d "$d" ] || return 0
  if [ "$v" = 2 ]; then
    sed -n 's/^oom_kill \([0-9]*\)$/oom_kill \1/p; s/^max \([0-9]*\)$/limit_hits \1/p' "$d/memory.events"
    echo "memory_limit_bytes $(cat "$d/memory.max")"
    if [ -f "$d/memory.peak" ]; then echo "memory_peak_bytes $(cat "$d/memory.peak")"; fi
  else
    sed -n 's/^oom_kill \([0-9]*\)$/oom_kill \1/p' "$d/memory.oom_control"
    echo "memory_limit_bytes $(cat "$d/memory.limit_in_bytes")"
    echo "memory_peak_bytes $(cat "$d/memory.max_usage_in_bytes")"
    echo "limit_hits $(cat "$d/memory.failcnt")"
  fi
}
