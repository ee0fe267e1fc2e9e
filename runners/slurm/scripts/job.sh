# shellcheck shell=bash
# servetune Slurm job body (after the #SBATCH lines and the exports servetune writes above it): records the
# job's nodes, then runs ./run.sh (the wrapper every servetune server runs in) as the leader of a session of
# its own, as start.sh does on a plain host, and waits for it. Slurm signals a batch job's own process group
# (scancel --signal=TERM --full, a time limit, a cancel), which the server's session is not in: the trap
# passes the signal on to the server's group, and this shell waits until run.sh has written the exit code.
# The job's nodes, for a launch script that starts ranks on them (srun --overlap --nodelist=NODE): the head
# node (where this script and rank 0 run) first, in ./nodes and in SERVETUNE_NODES. Ranks 1 and up are
# started by servetune as steps of this job (srun --overlap --nodelist=NODE) once it runs.
SERVETUNE_HEAD=${SLURMD_NODENAME:-$(hostname -s)}
{ echo "$SERVETUNE_HEAD"; scontrol show hostnames "${SLURM_JOB_NODELIST:?}" | grep -vxF "$SERVETUNE_HEAD"; } \
  > nodes.tmp 2>/dev/null && mv nodes.tmp nodes
SERVETUNE_NODES=$(paste -sd ' ' nodes)
# The head's address for the other ranks' dist-init (Slurm's NodeAddr of the head; its name when none).
SERVETUNE_HEAD_ADDR=$(scontrol show node -o "$SERVETUNE_HEAD" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
SERVETUNE_HEAD_ADDR=${SERVETUNE_HEAD_ADDR:-$SERVETUNE_HEAD}
export SERVETUNE_HEAD SERVETUNE_NODES SERVETUNE_HEAD_ADDR
pass_on() {
  if [ -s pgid ]; then kill "-$1" -- "-$(cat pgid)" 2>/dev/null; fi
}
trap 'pass_on TERM' TERM
trap 'pass_on INT' INT
trap 'pass_on HUP' HUP
setsid bash ./run.sh &
server=$!
while kill -0 "$server" 2>/dev/null; do
  wait "$server"
done
