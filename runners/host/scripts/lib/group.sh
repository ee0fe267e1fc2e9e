# shellcheck shell=bash
# The process group of a servetune server: its live members, and whether it is the run servetune started.

# Live (non-zombie) members of process group $1 and of the session of the same id, one pid a line.
members() {
  local p s
  for p in $( { pgrep -g "$1"; pgrep -s "$1"; } 2>/dev/null | sort -u ); do
    s=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)
    if [ -n "$s" ] && [ "$s" != Z ]; then echo "$p"; fi
  done
}

# Whether a member of group $1 carries run id $2 (SERVETUNE_RUN_ID, set by start.sh) in its environment.
ours() {
  local p
  for p in $(members "$1"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qxF "SERVETUNE_RUN_ID=$2" && return 0
  done
  return 1
}
