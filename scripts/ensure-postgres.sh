#!/usr/bin/env bash
# Make sure a PostgreSQL server answers at the URL the tests use.
#
#   ./scripts/ensure-postgres.sh            # uses $DELAYBRIDGE_TEST_POSTGRES_URL
#   DELAYBRIDGE_TEST_POSTGRES_URL=postgres://u@host:5432/db ./scripts/ensure-postgres.sh
#
# For a local URL (host 127.0.0.1, localhost or ::1) it installs Debian's
# postgresql if it is missing (root only, or passwordless sudo), creates a
# cluster on the URL's port if none uses that port (pg_createcluster, UTF8),
# starts it if it is down (`pg_ctlcluster --skip-systemctl-redirect ... start`,
# no systemd needed), and waits until `pg_isready` succeeds. When the port is
# already open and a test connection works, it does nothing else and returns
# at once.
#
# Passwordless access: the tests connect over TCP as user postgres without a
# password. On a cluster this script created, and on a running cluster that
# refuses the connection for authentication, it sets the method of the
# pg_hba.conf lines for host 127.0.0.1/32 and ::1/128 to `trust` (adding such
# lines at the top if there are none), keeps a backup next to the file, says
# what it changed, and reloads the cluster. Nothing else is ever changed.
# For any other host it only reports whether the server is reachable.
#
# Environment:
#   DELAYBRIDGE_TEST_POSTGRES_URL  server URL (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
#   POSTGRES_START_TIMEOUT         seconds to wait for the server (default 60)
set -euo pipefail

PG_URL="${DELAYBRIDGE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}"
START_TIMEOUT="${POSTGRES_START_TIMEOUT:-60}"

LOG_TAG=ensure-postgres
# shellcheck source=scripts/ensure-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/ensure-lib.sh"
redacted() { sed -E 's#(://[^:/@]*:)[^@]*@#\1***@#' <<<"$1"; }

# --- parse scheme://[user[:pass]@]host[:port][/db][?query], or key=value ------
host=""
port=""
if [[ "${PG_URL}" == *://* ]]; then
  rest="${PG_URL#*://}"
  rest="${rest%%\?*}"    # drop ?query
  rest="${rest%%/*}"     # drop /db
  split_hostport "${rest##*@}" # drop user:pass@
else # key=value connection string
  for kv in ${PG_URL}; do
    case "${kv}" in
      host=*) host="${kv#host=}" ;;
      port=*) port="${kv#port=}" ;;
    esac
  done
fi
host="${host:-localhost}"
port="${port:-5432}"
[[ "${port}" =~ ^[0-9]+$ ]] || die "bad port '${port}' in DELAYBRIDGE_TEST_POSTGRES_URL"

# ready: the server accepts connections (pg_isready when installed).
ready() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "${host}" -p "${port}" -t 2
  else
    port_open "${host}" "${port}"
  fi
}

# try_connect: run one query with the test URL; its error goes to $conn_err.
# Without psql there is no way to tell, and it counts as a success.
conn_err=""
try_connect() {
  command -v psql >/dev/null 2>&1 || return 0
  conn_err="$(PGCONNECT_TIMEOUT=5 psql -w "${PG_URL}" -XAtqc 'SELECT 1' 2>&1 >/dev/null)" && return 0
  return 1
}
auth_failure() {
  grep -Eqi 'password|authentication|pg_hba|no password supplied' <<<"${conn_err}"
}

case "${host}" in
  127.*|localhost|::1) ;;
  /*)
    log "unix socket ${host}: not managing it"
    exit 0
    ;;
  *)
    if ready; then
      log "external server ${host}:${port} is reachable; not managing it"
    else
      log "WARNING: external server ${host}:${port} is not reachable; not managing it"
    fi
    exit 0
    ;;
esac

# Fast path: the server is up and lets the tests in.
if port_open "${host}" "${port}"; then
  if try_connect; then
    log "PostgreSQL is up on ${host}:${port}"
    exit 0
  fi
  if ! auth_failure; then
    log "WARNING: PostgreSQL listens on ${host}:${port}, but connecting as $(redacted "${PG_URL}") fails:"
    printf '%s\n' "${conn_err}" >&2
    exit 0
  fi
  log "PostgreSQL on ${host}:${port} refuses the tests' connection for authentication:"
  printf '  %s\n' "${conn_err}"
fi

# --- from here we have to act on the local server: need root -----------------
if ! have_root; then
  die "PostgreSQL is not usable on ${host}:${port}, and managing it needs root.
  Run this script as root (or with passwordless sudo), or start a server yourself, e.g.:
    sudo apt-get install -y postgresql && sudo pg_ctlcluster --skip-systemctl-redirect 15 main start
  or point DELAYBRIDGE_TEST_POSTGRES_URL at a running server."
fi

if ! command -v pg_lsclusters >/dev/null 2>&1 || ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  log "PostgreSQL is not installed; installing it from the Debian repositories"
  as_root apt-get update
  # A UTF8 locale, so that the cluster the package creates stores UTF8.
  as_root env DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 LC_ALL=C.UTF-8 \
    apt-get install -y --no-install-recommends postgresql postgresql-client
fi

# The cluster on our port: "version name status" from pg_lsclusters.
cluster_on_port() {
  pg_lsclusters -h 2>/dev/null | awk -v p="${port}" '$3 == p { print $1, $2, $4; exit }'
}

created=0
trusted=0
read -r ver name status < <(cluster_on_port || true) || true
if [[ -z "${ver:-}" ]] && port_open "${host}" "${port}"; then
  die "${host}:${port} is open, but no cluster of this machine (pg_lsclusters) uses that port: cannot change its authentication.
  Point DELAYBRIDGE_TEST_POSTGRES_URL at a user it lets in, or fix its pg_hba.conf."
fi
if [[ -z "${ver:-}" ]]; then
  ver="$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort -n | tail -n 1)"
  [[ -n "${ver}" ]] || die "no PostgreSQL server version found in /usr/lib/postgresql"
  name=main
  if pg_lsclusters -h 2>/dev/null | awk -v v="${ver}" '$1 == v && $2 == "main" { f = 1 } END { exit !f }'; then
    name=delaybridge_test # main exists on another port: leave it alone
  fi
  log "no cluster uses port ${port}; creating cluster ${ver}/${name} on it (pg_createcluster, UTF8)"
  as_root pg_createcluster --encoding=UTF8 --locale=C.UTF-8 --port="${port}" "${ver}" "${name}"
  created=1
  status=down
fi

hba="/etc/postgresql/${ver}/${name}/pg_hba.conf"

# allow_trust: passwordless TCP from 127.0.0.1 and ::1 (see the header).
allow_trust() {
  as_root test -f "${hba}" || die "cannot find ${hba} to allow passwordless local connections"
  local backup="" # none needed for a cluster this script just created
  if [[ "${created}" -eq 0 ]]; then
    backup="${hba}.before-ensure-postgres.$(date +%Y%m%d%H%M%S)"
    as_root cp -p "${hba}" "${backup}"
  fi
  local re='^([[:space:]]*host[[:space:]]+all[[:space:]]+all[[:space:]]+(127\.0\.0\.1/32|::1/128)[[:space:]]+)[^[:space:]#]+'
  if as_root grep -Eq "${re}" "${hba}"; then
    as_root sed -E -i "s@${re}@\\1trust@" "${hba}"
  else # no such lines: add them at the top (the first matching line wins)
    local tmp
    tmp="$(mktemp)"
    {
      echo '# added by delaybridge scripts/ensure-postgres.sh: passwordless local TCP for the tests'
      echo 'host all all 127.0.0.1/32 trust'
      echo 'host all all ::1/128 trust'
      as_root cat "${hba}"
    } >"${tmp}"
    as_root cp "${tmp}" "${hba}" # onto the existing file: its owner and mode stay
    rm -f "${tmp}"
  fi
  trusted=1
  log "set method 'trust' for host connections from 127.0.0.1/32 and ::1/128 in ${hba}${backup:+ (backup: ${backup})}; it now reads:"
  as_root grep -Ev '^[[:space:]]*(#|$)' "${hba}" | sed 's/^/  /'
}

show_logs() {
  local f="/var/log/postgresql/postgresql-${ver}-${name}.log"
  if as_root test -s "${f}"; then echo "--- ${f} (tail)"; as_root tail -n 30 "${f}" || true; fi
}

if [[ "${created}" -eq 1 ]]; then
  allow_trust
fi

if [[ "${status}" == online* ]] && port_open "${host}" "${port}"; then
  # Up, but it refused the tests for authentication (the fast path said so).
  [[ "${trusted}" -eq 1 ]] || allow_trust
  as_root pg_ctlcluster --skip-systemctl-redirect "${ver}" "${name}" reload
  log "reloaded cluster ${ver}/${name}"
elif [[ "${status}" == online* ]]; then
  log "cluster ${ver}/${name} is online but ${host}:${port} is closed (listen_addresses?); waiting briefly"
  ((START_TIMEOUT > 10)) && START_TIMEOUT=10
else
  log "starting cluster ${ver}/${name} with 'pg_ctlcluster --skip-systemctl-redirect ${ver} ${name} start'"
  if ! as_root pg_ctlcluster --skip-systemctl-redirect "${ver}" "${name}" start; then
    show_logs >&2 || true
    die "'pg_ctlcluster ${ver} ${name} start' failed"
  fi
fi

log "waiting up to ${START_TIMEOUT}s for ${host}:${port}"
deadline=$((SECONDS + START_TIMEOUT))
until ready; do
  if ((SECONDS >= deadline)); then
    show_logs >&2 || true
    die "PostgreSQL did not accept connections on ${host}:${port} within ${START_TIMEOUT}s (see the log above and /var/log/postgresql/)"
  fi
  sleep 1
done

if ! try_connect; then
  if auth_failure && [[ "${trusted}" -eq 0 ]]; then
    log "the server refuses the tests' connection for authentication: ${conn_err}"
    allow_trust
    as_root pg_ctlcluster --skip-systemctl-redirect "${ver}" "${name}" reload
    sleep 1
    try_connect || die "connecting as $(redacted "${PG_URL}") still fails: ${conn_err}"
  else
    die "PostgreSQL is up on ${host}:${port}, but connecting as $(redacted "${PG_URL}") fails: ${conn_err}"
  fi
fi
log "PostgreSQL is up on ${host}:${port}"
