#!/usr/bin/env bash
# servetune port_holder: who listens on TCP port $1: "free", "ours" (a member of process group $2 holds the
# listening socket; 0 for no group), "foreign", or "unknown" where /proc/net/tcp cannot be read (not Linux).
# shellcheck source=lib/group.sh
. "${SERVETUNE_LIB:?}/group.sh"
[ -r /proc/net/tcp ] || { echo unknown; exit 0; }
hex=$(printf '%04X' "$1")
# Socket inodes in state 0A (LISTEN) whose local address ends in :PORT.
inodes=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=":$hex" \
  '$4 == "0A" && toupper(substr($2, length($2) - 4)) == p { print $10 }')
[ -n "$inodes" ] || { echo free; exit 0; }
if [ "$2" -gt 0 ]; then
  for p in $(members "$2"); do
    fds=$(readlink "/proc/$p/fd/"* 2>/dev/null)
    for i in $inodes; do
      case $fds in *"socket:[$i]"*) echo ours; exit 0 ;; esac
    done
  done
fi
echo foreign
