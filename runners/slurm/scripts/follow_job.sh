#!/usr/bin/env bash
# servetune follow (Slurm): print server.log of run directory $1 from its start, live, until the server has
# exited (run.sh wrote exit_code) or job $2 is no longer active (it never ran, or Slurm ended it). squeue is
# asked every $3 seconds; a failed squeue (the controller busy) is not an end, a job
# the controller no longer knows is.
cd "$1" || exit 1
tail -n +1 -F -s 0.1 server.log 2>/dev/null &
t=$!
next=0
while kill -0 "$t" 2>/dev/null; do
  if [ -e exit_code ]; then sleep 0.2; kill "$t" 2>/dev/null; break; fi
  now=$(date +%s)
  if [ "$now" -ge "$next" ]; then
    next=$(( now + $3 ))
    if state=$(squeue -h -j "$2" -o %T 2>&1); then
      case $state in
        PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|REQUEUED|RESIZING|SIGNALING|STAGE_OUT) ;;
        *) sleep 0.5; kill "$t" 2>/dev/null; break ;;
      esac
    else
      case $state in  # the controller has forgotten the job: it ended long ago
        *"Invalid job id"*) kill "$t" 2>/dev/null; break ;;
      esac
    fi
  fi
  sleep 0.1
done
wait "$t" 2>/dev/null
exit 0
