#!/usr/bin/env bash
# Make sure a RabbitMQ broker answers at the AMQP URL the tests use, with its
# management HTTP API on.
#
#   ./scripts/ensure-rabbitmq.sh            # uses $DELAYBRIDGE_TEST_AMQP_URL
#   DELAYBRIDGE_TEST_AMQP_URL=amqp://u:p@host:5672/ ./scripts/ensure-rabbitmq.sh
#
# For a local URL (host 127.0.0.1, localhost or ::1) it installs Debian's
# rabbitmq-server if it is missing (root only, or passwordless sudo), starts the
# node if it is down (`rabbitmq-server -detached`, no systemd needed), starts
# the RabbitMQ application if the node runs but the app was stopped
# (`rabbitmqctl start_app`), and waits until the AMQP port accepts connections.
# Then, when nothing listens on the management port, it enables the management
# plugin (`rabbitmq-plugins enable rabbitmq_management`, which the running node
# takes at once and keeps across restarts) and waits for the port: the tests of
# `delaybridge migrate-bindings` and of the bridge's binding check use the
# management API, and tests that need a virtual host of their own create it
# there. With both ports open it does nothing and returns at once.
# For any other host it only reports whether the ports are reachable.
#
# Environment:
#   DELAYBRIDGE_TEST_AMQP_URL     broker URL (default amqp://guest:guest@127.0.0.1:5672/)
#   DELAYBRIDGE_TEST_MANAGEMENT_PORT  the management API's port on that host (default 15672)
#   RABBITMQ_START_TIMEOUT        seconds to wait for the broker (default 90)
set -euo pipefail

AMQP_URL="${DELAYBRIDGE_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
MGMT_PORT="${DELAYBRIDGE_TEST_MANAGEMENT_PORT:-15672}"
START_TIMEOUT="${RABBITMQ_START_TIMEOUT:-90}"

LOG_TAG=ensure-rabbitmq
# shellcheck source=scripts/ensure-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/ensure-lib.sh"

# --- parse scheme://[user[:pass]@]host[:port][/vhost] -------------------------
scheme="${AMQP_URL%%://*}"
rest="${AMQP_URL#*://}"
rest="${rest%%/*}"     # drop /vhost
rest="${rest%%\?*}"    # drop ?query
split_hostport "${rest##*@}" # drop user:pass@
if [[ -z "${port}" ]]; then
  if [[ "${scheme}" == "amqps" ]]; then port=5671; else port=5672; fi
fi
[[ -n "${host}" ]] || die "cannot find a host in DELAYBRIDGE_TEST_AMQP_URL"
[[ "${port}" =~ ^[0-9]+$ ]] || die "bad port '${port}' in DELAYBRIDGE_TEST_AMQP_URL"

case "${host}" in
  127.*|localhost|::1) ;;
  *)
    if port_open "${host}" "${port}"; then
      log "external broker ${host}:${port} is reachable; not managing it"
    else
      log "WARNING: external broker ${host}:${port} is not reachable; not managing it"
    fi
    if ! port_open "${host}" "${MGMT_PORT}"; then
      log "WARNING: nothing answers on ${host}:${MGMT_PORT}: enable the management plugin there (the tests that use the management API skip, or fail under CI=true)"
    fi
    exit 0
    ;;
esac

# ensure_management enables the management plugin unless its port answers,
# and waits for the port. rabbitmq-plugins enables it on the running node
# and records it in the node's enabled_plugins file, so doing it again is a
# no-op and a restarted node keeps it.
ensure_management() {
  if port_open "${host}" "${MGMT_PORT}"; then
    return 0
  fi
  if ! have_root; then
    log "WARNING: nothing answers on ${host}:${MGMT_PORT} and enabling the management plugin needs root; run: rabbitmq-plugins enable rabbitmq_management"
    return 0
  fi
  log "enabling the management plugin ('rabbitmq-plugins enable rabbitmq_management')"
  as_root rabbitmq-plugins enable rabbitmq_management >/dev/null || die "'rabbitmq-plugins enable rabbitmq_management' failed"
  local deadline=$((SECONDS + START_TIMEOUT))
  until port_open "${host}" "${MGMT_PORT}"; do
    if ((SECONDS >= deadline)); then
      die "the management API did not open ${host}:${MGMT_PORT} within ${START_TIMEOUT}s (is management.tcp.port set elsewhere in rabbitmq.conf? then set DELAYBRIDGE_TEST_MANAGEMENT_PORT)"
    fi
    sleep 1
  done
  log "the management API is up on ${host}:${MGMT_PORT}"
}

# Fast path: something already listens on the AMQP port.
if port_open "${host}" "${port}"; then
  log "RabbitMQ is up on ${host}:${port}"
  ensure_management
  exit 0
fi

# --- from here we have to act on the local broker: need root ---------------
if ! have_root; then
  die "RabbitMQ is not reachable on ${host}:${port}, and managing it needs root.
  Run this script as root (or with passwordless sudo), or start a broker yourself, e.g.:
    sudo apt-get install -y rabbitmq-server && sudo rabbitmq-server -detached
  or point DELAYBRIDGE_TEST_AMQP_URL at a running broker."
fi

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  log "rabbitmq-server is not installed; installing it from the Debian repositories"
  as_root apt-get update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server
  # A container often has a hostname that does not resolve, and the default
  # node name is rabbit@<hostname>. Pin the node to localhost in that case,
  # unless the package already started a node (its name must then not change).
  if ! getent hosts "$(hostname -s)" >/dev/null 2>&1 \
    && ! grep -qs '^NODENAME=' /etc/rabbitmq/rabbitmq-env.conf \
    && ! as_root rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
    log "hostname does not resolve; setting NODENAME=rabbit@localhost in /etc/rabbitmq/rabbitmq-env.conf"
    echo 'NODENAME=rabbit@localhost' | as_root tee -a /etc/rabbitmq/rabbitmq-env.conf >/dev/null
  fi
fi

show_logs() {
  local f
  for f in /var/log/rabbitmq/startup_err /var/log/rabbitmq/startup_log; do
    if [[ -s "${f}" ]]; then echo "--- ${f} (tail)"; as_root tail -n 20 "${f}" || true; fi
  done
  f="$(as_root sh -c 'ls -t /var/log/rabbitmq/rabbit*.log 2>/dev/null | head -n 1' || true)"
  if [[ -n "${f}" ]]; then echo "--- ${f} (tail)"; as_root tail -n 30 "${f}" || true; fi
}

if as_root rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
  # The Erlang node runs but the AMQP port is closed: the RabbitMQ application
  # is stopped (rabbitmqctl stop_app) or still booting.
  if as_root rabbitmq-diagnostics -q check_running >/dev/null 2>&1; then
    # Fully booted yet the port stays closed: most likely the broker listens
    # elsewhere (listeners.tcp.* in rabbitmq.conf). Do not wait long for that.
    log "RabbitMQ node is running but ${host}:${port} is closed; its listeners:"
    as_root rabbitmq-diagnostics -q listeners || true
    ((START_TIMEOUT > 15)) && START_TIMEOUT=15
  else
    log "RabbitMQ node is up but its application is stopped; running 'rabbitmqctl start_app'"
    if ! as_root rabbitmqctl -q start_app; then
      log "start_app failed (the node may still be booting); waiting for it"
      as_root rabbitmqctl -q -t "${START_TIMEOUT}" await_startup || true
    fi
  fi
else
  log "RabbitMQ is not running; starting it with 'rabbitmq-server -detached'"
  if ! as_root rabbitmq-server -detached; then
    show_logs >&2 || true
    die "'rabbitmq-server -detached' failed"
  fi
fi

log "waiting up to ${START_TIMEOUT}s for ${host}:${port}"
deadline=$((SECONDS + START_TIMEOUT))
until port_open "${host}" "${port}"; do
  if ((SECONDS >= deadline)); then
    show_logs >&2 || true
    die "RabbitMQ did not open ${host}:${port} within ${START_TIMEOUT}s (see the logs above and /var/log/rabbitmq/)"
  fi
  sleep 1
done
log "RabbitMQ is up on ${host}:${port}"
ensure_management
