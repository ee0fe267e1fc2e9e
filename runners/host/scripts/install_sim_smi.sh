#!/usr/bin/env bash
# servetune install_sim_smi: the simulated host's nvidia-smi for profile $3, installed with python $2 into folder
# $1 (under the host's runs root) unless one is there already (other controllers may be using its state);
# prints the folder.
# shellcheck source=lib/paths.sh
. "${SERVETUNE_LIB:?}/paths.sh"
dir=$(host_path "$1")
mkdir -p "$dir" && cd "$dir" || exit 1
if [ ! -x bin/nvidia-smi ]; then
  "$2" -m runners.simhost install-smi --sim-profile "$3" --state-dir state --bin-dir bin >&2 || exit 1
fi
pwd
