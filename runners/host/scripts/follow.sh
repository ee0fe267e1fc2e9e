#!/usr/bin/env bash
# servetune follow: print server.log of run directory $1 from its start, live, until the server has exited.
# tail --pid=$2 (the group leader) alone would wait until the wrapper is reaped, which an init process may do
# seconds late; run.sh writes exit_code the moment the server exits, so watch it too (and give tail a
# moment to deliver the last lines).
cd "$1" || exit 1
tail -n +1 -F -s 0.1 --pid="$2" server.log 2>/dev/null &
t=$!
while kill -0 "$t" 2>/dev/null; do
  if [ -e exit_code ]; then sleep 0.2; kill "$t" 2>/dev/null; break; fi
  sleep 0.05
done
wait "$t" 2>/dev/null
exit 0
