#!/usr/bin/env bash
# servetune run wrapper, copied into each run directory and started there by start.sh: records the process
# group, runs ./launch.sh with every stream redirected, records the server's exit code. It reads its
# settings from files beside it: memory_limit ("BYTES NAME", optional) and scratch_vars (one name a line).
cd "$(dirname "$0")" || exit 97

# Opt-in memory limit: the wrapper joins a memory cgroup of its own before it starts the server, so the
# whole tree is inside. cgroup v2 where its root offers the memory controller, else the v1 memory
# hierarchy. Where neither can be written nothing is started: cgroup_error says why.
cg_join() {  # $1 limit in bytes, $2 cgroup name
  local root=/sys/fs/cgroup d p
  if grep -qw memory "$root/cgroup.controllers" 2>/dev/null; then
    d=$root/servetune/$2
    mkdir -p "$root/servetune" || return 1
    for p in "$root" "$root/servetune"; do
      grep -qw memory "$p/cgroup.subtree_control" || echo +memory > "$p/cgroup.subtree_control" || return 1
    done
    mkdir -p "$d" && echo "$1" > "$d/memory.max" || return 1
    if [ -f "$d/memory.swap.max" ]; then echo 0 > "$d/memory.swap.max" || return 1; fi
    echo $$ > "$d/cgroup.procs" || return 1
    echo "2 $d" > cgroup
  elif [ -f "$root/memory/memory.limit_in_bytes" ]; then
    d=$root/memory/servetune/$2
    mkdir -p "$d" && echo "$1" > "$d/memory.limit_in_bytes" || return 1
    if [ -f "$d/memory.memsw.limit_in_bytes" ]; then
      echo "$1" > "$d/memory.memsw.limit_in_bytes" 2>/dev/null
    fi
    echo $$ > "$d/cgroup.procs" || return 1
    echo "1 $d" > cgroup
  else
    echo "no cgroup v2 memory controller in $root/cgroup.controllers and no v1 memory hierarchy" >&2
    return 1
  fi
}
if [ -s memory_limit ]; then
  read -r limit name < memory_limit
  if ! cg_join "$limit" "$name" 2> cgroup_error.tmp; then
    why=$(tail -n 1 cgroup_error.tmp)
    echo "cannot create a memory cgroup for the server (needs root and cgroup v2 memory): $why" > cgroup_error
    rm -f cgroup_error.tmp
    exit 96
  fi
  rm -f cgroup_error.tmp
fi
echo $$ > pgid.tmp && mv pgid.tmp pgid

# Per-trial scratch directories (TMPDIR and engine caches) in ./scratch, removed by servetune after the
# stop. The variables name them through a short alias, /tmp/servetune.XXXXXXXX -> ./scratch: engines bind
# unix sockets in TMPDIR, and a socket path over 107 bytes cannot be bound (vLLM: "ipc path ... is
# longer than 107 characters").
if [ -s scratch_vars ]; then
  mkdir -p scratch
  alias=$(mktemp -u /tmp/servetune.XXXXXXXX)
  if [ -n "$alias" ] && ln -s "$PWD/scratch" "$alias" 2>/dev/null; then
    echo "$alias" > scratch_alias
  else
    alias=$PWD/scratch
  fi
  while read -r var; do
    [ -n "$var" ] || continue
    mkdir -p "scratch/$var" && export "$var=$alias/$var"
  done < scratch_vars
fi

# A handler (not "ignore") so the server does not inherit an ignored SIGTERM, and so the wrapper outlives a
# group SIGTERM long enough to write the server's exit code.
trap ':' TERM INT HUP
bash ./launch.sh > server.log 2>&1 < /dev/null
rc=$?
if [ -s scratch_alias ]; then rm -f "$(cat scratch_alias)"; fi
echo $rc > exit_code.tmp && mv exit_code.tmp exit_code
