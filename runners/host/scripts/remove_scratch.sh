#!/usr/bin/env bash
# servetune remove_scratch: delete run directory $1's scratch directories and their short /tmp alias (run
# only once the server's process group is gone).
a=$(cat "$1/scratch_alias" 2>/dev/null)
case $a in /tmp/servetune.*) if [ -L "$a" ]; then rm -f "$a"; fi ;; esac
rm -rf "$1/scratch" "$1/scratch_alias"
