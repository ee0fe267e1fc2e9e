#!/usr/bin/env bash
# servetune start: run ./run.sh of run directory $1 detached, in a session of its own, with
# SERVETUNE_RUN_ID=$2 (stop.sh signals only a group that carries it); print the group id once run.sh has
# recorded it, or "CGROUP_ERROR why" when it could not make the memory cgroup.
cd "$1" || exit 1
{ SERVETUNE_RUN_ID=$2 setsid bash ./run.sh & } < /dev/null > /dev/null 2>&1
for _ in $(seq 1 200); do
  if [ -s pgid ] || [ -s cgroup_error ]; then break; fi
  sleep 0.02
done
if [ -s cgroup_error ]; then echo "CGROUP_ERROR $(cat cgroup_error)"; else cat pgid; fi
