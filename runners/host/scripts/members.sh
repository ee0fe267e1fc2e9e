#!/usr/bin/env bash
# servetune members: the live members of process group $1, one pid a line.
# shellcheck source=lib/group.sh
. "${SERVETUNE_LIB:?}/group.sh"
members "$1"
