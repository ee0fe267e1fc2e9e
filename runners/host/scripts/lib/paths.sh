# shellcheck shell=bash
# Host paths as servetune passes them: a leading ~/ is the home directory of the user the command runs as.
host_path() {
  case $1 in
    \~/*) printf '%s\n' "$HOME/${1#\~/}" ;;
    *) printf '%s\n' "$1" ;;
  esac
}
