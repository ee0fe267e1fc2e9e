#!/usr/bin/env bash
# servetune http_get: GET path $2 from 127.0.0.1 port $1 on this host over bash's /dev/tcp, reading the answer
# for at most $3 seconds; exit 7 when nothing listens. Works where the host is only reachable over SSH.
exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 7
printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
timeout "$3" cat <&3
