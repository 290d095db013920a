# shellcheck shell=bash
# Sourced by the launch scripts: every command goes through `run`, which prints it and,
# unless dry_run=1, runs it; so --dry-run shows exactly what a real launch does.

# set -e stops at a failed command; say which, so the stop is not silent.
trap 'echo "${0##*/}: failed (exit $?): $BASH_COMMAND" >&2' ERR

# One line per command, quoted (only where needed) so it can be pasted into a shell.
show() {
  local arg out="+"
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then out+=" $arg"; else out+=" '${arg//\'/\'\\\'\'}'"; fi
  done
  echo "$out"
}

run() {
  show "$@"
  if ((${dry_run:-0})); then return 0; fi
  "$@"
}

# Tracked and untracked (not ignored) files of the checkout at $1, as a tarball at $2:
# the working tree as it is, uncommitted edits included.
pack_checkout() {
  echo "+ (cd $1 && git ls-files -z --cached --others --exclude-standard | tar --null -czf $2 -T -)"
  if ((${dry_run:-0})); then return 0; fi
  (cd "$1" && git ls-files -z --cached --others --exclude-standard | tar --null -czf "$2" -T -)
}
