#!/usr/bin/env bash
# servetune cgroup_evidence: what run directory $1's memory cgroup saw, as "key value" lines.
# shellcheck source=lib/cgroup.sh
. "${SERVETUNE_LIB:?}/cgroup.sh"
cg_evidence "$1"
