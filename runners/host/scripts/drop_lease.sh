#!/usr/bin/env bash
# servetune drop_lease: in the GPU set's folder $1 (see host_dir.sh), remove controller $2's lease, its place
# in the queue, and the claim if it holds it.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
# shellcheck source=lib/claim.sh
. "${SERVETUNE_LIB:?}/claim.sh"
d=$(host_path "$1")
rm -f "$d/leases/$2.json" "$d/queue/"*"+$2"
release_claim "$d/claim" "$2"
