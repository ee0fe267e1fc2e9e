# shellcheck shell=bash
# Gives claim directory $1 back if controller $2 holds it.
release_claim() {
  if [ "$(cat "$1/controller" 2>/dev/null)" = "$2" ]; then rm -rf "$1"; fi
}
