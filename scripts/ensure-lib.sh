# shellcheck shell=bash
# What scripts/ensure-rabbitmq.sh and scripts/ensure-postgres.sh share.
# Sourced, not run: the caller sets LOG_TAG (the prefix of its log lines)
# first.

# The servers' tools live in /usr/sbin, which is not on every user's PATH.
case ":${PATH}:" in *:/usr/sbin:*) ;; *) PATH="${PATH}:/usr/sbin:/sbin" ;; esac
export PATH

log() { printf '[%s] %s\n' "${LOG_TAG}" "$*"; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG}" "$*" >&2; exit 1; }

# split_hostport sets host and port from "host[:port]" or "[ipv6][:port]";
# port is empty when the argument names none.
split_hostport() {
  port=""
  if [[ "$1" == \[* ]]; then
    host="${1#[}"
    host="${host%%]*}"
    port="${1##*]}"
    port="${port#:}"
  else
    host="${1%%:*}"
    if [[ "$1" == *:* ]]; then port="${1##*:}"; fi
  fi
}

# TCP connect check (bash /dev/tcp, no extra tools needed).
port_open() {
  timeout 2 bash -c "exec 3<>'/dev/tcp/$1/$2'" 2>/dev/null
}

# have_root: this runs as root, or passwordless sudo works (then as_root
# runs its command through sudo).
SUDO=()
have_root() {
  [[ "$(id -u)" -eq 0 ]] && return 0
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
    return 0
  fi
  return 1
}
as_root() { "${SUDO[@]}" "$@"; }
