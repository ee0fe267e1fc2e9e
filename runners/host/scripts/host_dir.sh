#!/usr/bin/env bash
# servetune host_dir: the folder under $1 where the controllers of this machine's GPU set keep their leases,
# the claim and the queue, whatever their runs root or Unix user: $1/gpus-HASH, HASH over the GPUs' UUIDs as
# nvidia-smi lists them, only those CUDA_VISIBLE_DEVICES names (indices or UUIDs) when the host's environment
# sets it (no GPU: over the machine id). $1, the folder under it and its leases/ and queue/ are made sticky and
# world-writable (as /tmp is): a second user's controller can take over a dead one's claim, and nobody can
# rename or remove another user's file there. A symlink in their place is refused. Prints it.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
umask 000
base=$(host_path "$1")
if [ ! -d "$base" ]; then
  mkdir -p "$base" || exit 1
  chmod 1777 "$base" 2>/dev/null
fi
ids=$(timeout 20 nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null | head -c 65536 \
  | tr -d ' \r' | grep -E '^[0-9]+,(GPU|MIG)-[A-Za-z0-9-]+$' | while IFS=, read -r i u; do
      if [ -z "${CUDA_VISIBLE_DEVICES+set}" ]; then echo "$u"; continue; fi
      case ",$CUDA_VISIBLE_DEVICES," in *",$i,"*|*",$u,"*) echo "$u" ;; esac
    done | sort)
[ -n "$ids" ] || ids="no-gpus $(cat /etc/machine-id 2>/dev/null || hostname)"
key=$(printf '%s\n' "$ids" | sha256sum | cut -c1-16)
d=$base/gpus-$key
mkdir -p "$d/leases" "$d/queue" || exit 1
for f in "$d" "$d/leases" "$d/queue"; do
  if [ -L "$f" ]; then echo "$f is a symlink, not a folder: remove it" >&2; exit 1; fi
  [ -O "$f" ] && chmod 1777 "$f" 2>/dev/null
done
[ -w "$d" ] && [ -w "$d/leases" ] && [ -w "$d/queue" ] || { echo "$d is not writable by $(id -un)" >&2; exit 1; }
printf '%s\n' "$d"
