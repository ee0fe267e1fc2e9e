#!/usr/bin/env bash
# servetune follow: print server.log of run directory $1 from its start, live, until the server (group
# leader $2) has exited. The log is read by byte offset, never read again: when it has grown more than $3
# bytes (default 256 KiB) past what was sent, the middle is skipped (one line says how much), so a server that
# logs hundreds of MB before it is ready is seen ready moments after its ready line, and what travels to
# the controller stays bounded. Lines longer than 16 KiB are folded. run.sh writes exit_code the moment the
# server exits (the leader may be reaped late): then what is left is sent and the stream ends.
cd "$1" || exit 1
pid=$2
backlog=${3:-262144}
off=0
send() {  # bytes $1.. $2 (exclusive) of server.log
  tail -c +"$(($1 + 1))" server.log 2>/dev/null | head -c "$(($2 - $1))" | fold -b -w 16384
}
while :; do
  done_=0
  if [ -e exit_code ] || ! kill -0 "$pid" 2>/dev/null; then done_=1; fi
  size=$(stat -c %s server.log 2>/dev/null || echo 0)
  if [ "$size" -lt "$off" ]; then off=0; fi  # truncated or replaced: start again
  if [ "$size" -gt "$off" ]; then
    if [ $((size - off)) -gt "$backlog" ]; then
      skip=$((size - off - backlog))
      printf '\n[servetune: %d bytes of server.log skipped here: it grew faster than it could be followed]\n' \
        "$skip"
      off=$((off + skip))
    fi
    send "$off" "$size" || exit 0
    off=$size
  elif [ "$done_" = 1 ]; then
    exit 0
  else
    sleep 0.1
  fi
done
