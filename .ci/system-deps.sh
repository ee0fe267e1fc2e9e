#!/usr/bin/env bash
# Installs the Debian packages the test suite starts for real: sshd, PostgreSQL, Chromium (the browser
# test drives it through Playwright) and Slurm with munge (a throwaway cluster on loopback). Idempotent: only
# what is missing.
set -euo pipefail
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "system-deps: need ${need[*]} (run as root or install them)" >&2
    exit 1
  fi
  echo "system-deps: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p /run/sshd 2>/dev/null || true
