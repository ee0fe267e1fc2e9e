#!/usr/bin/env bash
# servetune drop_lease: remove controller $3's lease from lease directory $1, and claim directory $2 if it
# holds it.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
# shellcheck source=lib/claim.sh
. "${SERVETUNE_LIB:?}/claim.sh"
rm -f "$(host_path "$1")/$3.json"
release_claim "$(host_path "$2")" "$3"
