#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, beside the test broker, for
# the cluster tests (test/integration/cluster_test.go) and for trying the
# bridge against a cluster by hand.
#
#   ./scripts/rabbitmq-cluster.sh start    # start the nodes that are down, join them; idempotent
#   ./scripts/rabbitmq-cluster.sh status   # each node: running, app running, cluster members
#   ./scripts/rabbitmq-cluster.sh stop     # stop every node and remove the data; idempotent
#   ./scripts/rabbitmq-cluster.sh kill N   # SIGKILL node N's Erlang VM (a node that dies)
#   ./scripts/rabbitmq-cluster.sh partition N  # cut node N off from the other two (iptables)
#   ./scripts/rabbitmq-cluster.sh heal     # remove the partition's rules; idempotent
#   ./scripts/rabbitmq-cluster.sh urls     # the AMQP URLs, one a line
#
# Nodes cluster1@localhost … cluster3@localhost, AMQP on 127.0.0.1:5681–5683
# (guest/guest), Erlang distribution on 25681–25683, no plugins. Each node has
# its own config file, data, log and plugins file under $DELAYBRIDGE_CLUSTER_DIR
# (default /tmp/delaybridge-rabbitmq-cluster), so the system file (which pins
# listeners.tcp.local = 127.0.0.1:5672) and the node on 5672 are left alone.
# The nodes run as the rabbitmq user (runuser), with its Erlang cookie, and
# find each other through the classic_config peer discovery: node 1 starts
# first, nodes 2 and 3 join it as they boot. start on a cluster whose node was
# killed or stopped starts that node again, and it rejoins with its data.
#
# partition N cuts node N's Erlang distribution links to the other nodes,
# both ways, and leaves its AMQP listener alone (a node that clients reach
# but its peers do not). On loopback every node is 127.0.0.1, so the rules
# match node N's distribution port (connections to it) and the source
# address its own outgoing distribution connections are bound to, 127.0.1.N
# (inet_dist_connect_options). They reject with a TCP reset rather than drop,
# so both sides see the links go down at their next packet instead of after
# net_ticktime (60 s); RabbitMQ's partition handling is the same from there.
# The rules live in their own chain, DELAYBRIDGE_PARTITION, hooked into INPUT
# for lo; heal, start and stop remove them. partition needs iptables (and
# CAP_NET_ADMIN).
#
# It needs Debian's rabbitmq-server (already there for the test broker:
# scripts/ensure-rabbitmq.sh) and root; it installs nothing. The daemons keep
# no file descriptor of the caller's but 0–2, pointed at their log: a caller
# holding a lock (flock) or reading a pipe is not held up by them.
set -euo pipefail

case ":${PATH}:" in *:/usr/sbin:*) ;; *) PATH="${PATH}:/usr/sbin:/sbin" ;; esac
export PATH

DIR="${DELAYBRIDGE_CLUSTER_DIR:-/tmp/delaybridge-rabbitmq-cluster}"
NODES=(1 2 3)
START_TIMEOUT="${RABBITMQ_START_TIMEOUT:-120}"
SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server

log() { printf '[rabbitmq-cluster] %s\n' "$*"; }
die() { printf '[rabbitmq-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

node_name() { echo "cluster$1@localhost"; }
amqp_port() { echo $((5680 + $1)); }
dist_port() { echo $((25680 + $1)); }
# dist_src N: the address node N's outgoing distribution connections leave from.
dist_src() { echo "127.0.1.$1"; }
CHAIN=DELAYBRIDGE_PARTITION
ctl() { # ctl N args…: rabbitmqctl on node N (the Debian wrapper runs it as rabbitmq)
  local n="$1"
  shift
  timeout 60 rabbitmqctl -q -n "$(node_name "${n}")" "$@"
}

port_open() { timeout 2 bash -c "exec 3<>'/dev/tcp/127.0.0.1/$1'" 2>/dev/null; }

require() {
  [[ "$(id -u)" -eq 0 ]] || die "run as root: the nodes run as the rabbitmq user (runuser)"
  [[ -x "${SERVER}" ]] || die "${SERVER} not found: install Debian's rabbitmq-server (scripts/ensure-rabbitmq.sh)"
  id rabbitmq >/dev/null 2>&1 || die "no rabbitmq user"
}

# write_config N: the node's own files (rewritten each start: they are ours).
write_config() {
  local n="$1" d="${DIR}/node$1"
  mkdir -p "${d}/mnesia" "${d}/log"
  {
    echo "listeners.tcp.1 = 127.0.0.1:$(amqp_port "${n}")"
    echo "cluster_formation.peer_discovery_backend = classic_config"
    for m in "${NODES[@]}"; do echo "cluster_formation.classic_config.nodes.${m} = $(node_name "${m}")"; done
    # A node cut off from the majority pauses rather than run on alone
    # (RabbitMQ's advice for three nodes or more).
    echo "cluster_partition_handling = pause_minority"
    echo "log.console = false"
    echo "log.file.level = info"
  } >"${d}/rabbitmq.conf"
  echo "[]." >"${d}/enabled_plugins"
  # Replaces /etc/rabbitmq/rabbitmq-env.conf, which names the node on 5672.
  echo "ERL_EPMD_ADDRESS=127.0.0.1" >"${d}/rabbitmq-env.conf"
  chown -R rabbitmq:rabbitmq "${DIR}"
}

# launch N: starts node N's VM detached, as rabbitmq, keeping no fd of ours.
launch() {
  local n="$1" d="${DIR}/node$1"
  write_config "${n}"
  (
    for fd in /proc/${BASHPID}/fd/*; do
      fd="${fd##*/}"
      [[ "${fd}" -gt 2 ]] && eval "exec ${fd}>&-"
    done
    cd "${d}"
    exec </dev/null >>"${d}/log/startup.log" 2>&1
    exec runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq \
      RABBITMQ_NODENAME="$(node_name "${n}")" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$(amqp_port "${n}")" \
      RABBITMQ_DIST_PORT="$(dist_port "${n}")" \
      RABBITMQ_CONF_ENV_FILE="${d}/rabbitmq-env.conf" \
      RABBITMQ_CONFIG_FILE="${d}/rabbitmq.conf" \
      RABBITMQ_ADVANCED_CONFIG_FILE="${d}/advanced.config" \
      RABBITMQ_MNESIA_BASE="${d}/mnesia" \
      RABBITMQ_LOG_BASE="${d}/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="${d}/enabled_plugins" \
      RABBITMQ_PID_FILE="${d}/pid" \
      RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} -kernel inet_dist_connect_options [{ip,{$(dist_src "${n}" | tr . ,)}}]" \
      "${SERVER}" -detached
  )
}

# up N: node N's VM answers the CLI.
up() { ctl "$1" ping >/dev/null 2>&1; }

# ensure_node N: node N runs with its app started.
ensure_node() {
  local n="$1"
  if up "${n}"; then
    if ! port_open "$(amqp_port "${n}")"; then
      log "node ${n}: VM up, app stopped: start_app"
      ctl "${n}" start_app
    fi
    return 0
  fi
  log "node ${n}: starting $(node_name "${n}") (AMQP $(amqp_port "${n}"), distribution $(dist_port "${n}"))"
  launch "${n}"
}

await_node() {
  local n="$1" deadline=$((SECONDS + START_TIMEOUT))
  # await_startup fails at once while the VM is not yet registered.
  until up "${n}" || ((SECONDS > deadline)); do sleep 0.5; done
  if ! ctl "${n}" await_startup --timeout "${START_TIMEOUT}" >/dev/null 2>&1 ||
    ! timeout 30 bash -c "until exec 3<>/dev/tcp/127.0.0.1/$(amqp_port "${n}"); do sleep 0.2; done" 2>/dev/null; then
    tail -n 30 "${DIR}/node${n}/log/startup.log" "${DIR}/node${n}/log/"*.log >&2 2>/dev/null || true
    die "node ${n} did not start within ${START_TIMEOUT} s (logs above, in ${DIR}/node${n}/log)"
  fi
}

# running_members: the running nodes of node 1's cluster, one a line.
running_members() {
  ctl 1 eval 'lists:foreach(fun(N) -> io:format("~s~n", [N]) end, rabbit_nodes:all_running()).' 2>/dev/null |
    grep -E '^cluster[0-9]+@' || true
}

start() {
  require
  local began=${SECONDS}
  heal
  mkdir -p "${DIR}"
  ensure_node 1
  await_node 1
  for n in 2 3; do ensure_node "${n}"; done
  for n in 2 3; do await_node "${n}"; done
  # A node that booted before node 1 answered forms a cluster of its own:
  # join it explicitly.
  for n in 2 3; do
    if ! running_members | grep -qx "$(node_name "${n}")"; then
      log "node ${n}: not in node 1's cluster; joining it"
      ctl "${n}" stop_app
      ctl "${n}" reset
      ctl "${n}" join_cluster "$(node_name 1)"
      ctl "${n}" start_app
      await_node "${n}"
    fi
  done
  local members
  members="$(running_members | sort | paste -sd ' ' -)"
  [[ "${members}" == "cluster1@localhost cluster2@localhost cluster3@localhost" ]] ||
    die "the cluster runs on [${members}], want all three nodes"
  log "cluster up in $((SECONDS - began)) s: ${members}; AMQP 127.0.0.1:5681-5683"
}

status() {
  local rc=0
  for n in "${NODES[@]}"; do
    local vm=down app=stopped
    up "${n}" && vm=up
    port_open "$(amqp_port "${n}")" && app=running
    [[ "${app}" == running ]] || rc=1
    echo "$(node_name "${n}"): VM ${vm}, app ${app} (AMQP $(amqp_port "${n}"))"
  done
  if up 1; then echo "running members (from node 1): $(running_members | paste -sd ' ' -)"; fi
  return "${rc}"
}

pid_of() { cat "${DIR}/node$1/pid" 2>/dev/null || true; }

# is_node_vm N PID: PID is node N's Erlang VM (its environment names the
# node; the command line does not), never the node on 5672.
is_node_vm() {
  tr '\0' '\n' <"/proc/$2/environ" 2>/dev/null | grep -qx "RABBITMQ_NODENAME=$(node_name "$1")"
}

hard_kill() {
  local n="$1" pid
  [[ "${n}" =~ ^[123]$ ]] || die "kill: node 1, 2 or 3"
  pid="$(pid_of "${n}")"
  [[ -n "${pid}" ]] && kill -0 "${pid}" 2>/dev/null || die "node ${n} has no running VM (pid file ${DIR}/node${n}/pid)"
  is_node_vm "${n}" "${pid}" || die "pid ${pid} is not node ${n}'s VM"
  kill -KILL "${pid}"
  log "node ${n}: VM ${pid} killed (SIGKILL)"
}

stop() {
  heal
  for n in "${NODES[@]}"; do
    if up "${n}"; then
      log "node ${n}: stopping"
      ctl "${n}" stop >/dev/null 2>&1 || true
    fi
    local pid
    pid="$(pid_of "${n}")"
    if [[ -n "${pid}" ]] && kill -0 "${pid}" 2>/dev/null && is_node_vm "${n}" "${pid}"; then
      kill -KILL "${pid}" 2>/dev/null || true
    fi
  done
  rm -rf "${DIR}"
  log "stopped; ${DIR} removed"
}

# heal: no partition rules left (none there is fine, and so is no iptables).
heal() {
  command -v iptables >/dev/null 2>&1 || return 0
  iptables -w -n -L "${CHAIN}" >/dev/null 2>&1 || return 0
  while iptables -w -D INPUT -i lo -j "${CHAIN}" 2>/dev/null; do :; done
  iptables -w -F "${CHAIN}"
  iptables -w -X "${CHAIN}"
  log "partition rules removed"
}

# partition N: node N's distribution links to the others reset, both ways
# (see the top of this file).
partition() {
  local n="$1"
  [[ "${n}" =~ ^[123]$ ]] || die "partition: node 1, 2 or 3"
  command -v iptables >/dev/null 2>&1 || die "partition needs iptables (apt-get install -y iptables)"
  heal
  iptables -w -N "${CHAIN}" || die "iptables cannot create a chain: is CAP_NET_ADMIN missing?"
  local m
  for m in "--dport $(dist_port "${n}")" "--sport $(dist_port "${n}")" "-s $(dist_src "${n}")" "-d $(dist_src "${n}")"; do
    # shellcheck disable=SC2086 # m is two words
    iptables -w -A "${CHAIN}" -p tcp ${m} -m tcp ! --tcp-flags RST RST -j REJECT --reject-with tcp-reset
  done
  iptables -w -I INPUT 1 -i lo -j "${CHAIN}"
  log "node ${n}: partitioned (distribution port $(dist_port "${n}") and $(dist_src "${n}") cut off; AMQP $(amqp_port "${n}") open)"
}

case "${1:-}" in
  start) start ;;
  status) status ;;
  stop) require && stop ;;
  kill) require && hard_kill "${2:-}" ;;
  partition) require && partition "${2:-}" ;;
  heal) require && heal ;;
  urls) for n in "${NODES[@]}"; do echo "amqp://guest:guest@127.0.0.1:$(amqp_port "${n}")/"; done ;;
  *) die "usage: $0 start|status|stop|kill N|partition N|heal|urls" ;;
esac
