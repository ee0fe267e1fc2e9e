#!/usr/bin/env bash
# servetune stop: SIGTERM process group $1 if a member carries run id $2, SIGTERM again at half of $3 ms,
# SIGKILL at its end; print the outcome as one JSON line. $4 is the run directory (its scratch alias goes
# once the group is gone).
# shellcheck source=lib/group.sh
. "${SERVETUNE_LIB:?}/group.sh"
pg=$1 tag=$2 grace_ms=$3 dir=$4
case $pg in ''|*[!0-9]*|0|1) echo "stop.sh: $pg is not a process group servetune started" >&2; exit 2 ;; esac
drop_alias() {  # the short /tmp alias of the run's scratch directory (see run.sh), once all are gone
  local a
  a=$(cat "$dir/scratch_alias" 2>/dev/null)
  case $a in /tmp/servetune.*) rm -f "$a" ;; esac
}
if [ -z "$(members "$pg")" ]; then drop_alias; echo '{"result":"gone","ms":0,"survivors":[]}'; exit 0; fi
if ! ours "$pg" "$tag"; then echo '{"result":"not_ours"}'; exit 3; fi
ms() { echo $(( $(date +%s%N) / 1000000 )); }
start=$(ms)
kill -TERM -- "-$pg" 2>/dev/null
method="term" resent=false
deadline=$(( start + grace_ms )) half=$(( start + grace_ms / 2 ))
while [ -n "$(members "$pg")" ]; do
  now=$(ms)
  if [ $resent = false ] && [ "$now" -gt $half ]; then kill -TERM -- "-$pg" 2>/dev/null; resent=true; fi
  if [ "$now" -gt $deadline ]; then
    method="kill"
    for p in $(members "$pg"); do kill -KILL "$p" 2>/dev/null; done
    kill -KILL -- "-$pg" 2>/dev/null
    n=0
    while [ -n "$(members "$pg")" ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
    break
  fi
  sleep 0.05
done
end=$(ms)
surv=$(members "$pg" | paste -sd, -)
[ -n "$surv" ] || drop_alias
printf '{"result":"stopped","method":"%s","resent_term":%s,"ms":%s,"survivors":[%s]}\n' \
  "$method" "$resent" "$(( end - start ))" "$surv"
