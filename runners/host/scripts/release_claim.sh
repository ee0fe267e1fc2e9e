#!/usr/bin/env bash
# servetune release_claim: give claim directory $1 back if controller $2 holds it.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
# shellcheck source=lib/claim.sh
. "${SERVETUNE_LIB:?}/claim.sh"
release_claim "$(host_path "$1")" "$2"
