#!/usr/bin/env bash
# The project's test command: ./scripts/test.sh [extra go test args]
#
#   ./scripts/test.sh                      # everything
#   ./scripts/test.sh -run TestStore -v    # extra args go to `go test`
#   DELAYBRIDGE_TEST_PACKAGES=./storage/... ./scripts/test.sh
#
# The benchmark harness is a Go module of its own (bench/go.mod): it is
# vetted and tested too, in a step after the main one, unless
# DELAYBRIDGE_TEST_PACKAGES names the packages to test.
#
# 1. makes sure RabbitMQ answers at $DELAYBRIDGE_TEST_AMQP_URL
#    (default amqp://guest:guest@127.0.0.1:5672/; a local broker is installed
#    and started when needed, and its management plugin enabled when its port
#    is closed, see scripts/ensure-rabbitmq.sh), and PostgreSQL
#    at $DELAYBRIDGE_TEST_POSTGRES_URL (see scripts/ensure-postgres.sh), and
#    installs Node's amqplib for the real-client test (npm ci in
#    test/integration/amqplib, only when its lockfile changed), and Debian's
#    chromium for the status page's browser tests when missing,
# 2. checks formatting (gofmt -l),
# 3. go vet ./... (and in bench/), then lints and renders the Helm chart (helm is installed
#    from the Go module proxy when missing; see the Helm chart section),
# 4. go test -race -count=1 -timeout 15m $DELAYBRIDGE_TEST_PACKAGES "$@",
#    in two steps, because the tests of every package share one broker:
#    - the serial step runs the disruptive tests (those calling
#      testenv.Disruptive: they raise a broker memory alarm or stop the broker,
#      which any other test running at the time would see) alone: go test -p 1,
#      DELAYBRIDGE_TEST_DISRUPTIVE=1, -run '^(TestA|TestB)$';
#    - the main step runs all the tests, packages in parallel (the integration
#      tests, the longest, first); there the disruptive ones skip themselves
#      and write their names to a file (DELAYBRIDGE_TEST_DISRUPTIVE_DEFER;
#      under CI=true such a skip is not a failure: the serial step runs them).
#    Without extra args the serial step runs first, during steps 2 and 3,
#    which use no broker; it takes the disruptive tests of the selected
#    packages from their source (a Test function calling testenv.Disruptive).
#    A test the main step deferred but the serial step did not run (a helper
#    calling testenv.Disruptive, say; and all of them when extra args are
#    given, e.g. -run X: then exactly the disruptive tests -run X selects) runs
#    in a second serial step after the main one, with the same extra args. So
#    no disruptive test is left out, and none runs beside another test.
#    A serial step that runs a cluster test (TestCluster*) starts a three-node
#    RabbitMQ cluster beside the test broker first and stops it after
#    (scripts/rabbitmq-cluster.sh: nodes on ports 5681-5683, ~25 s to start),
#    installing iptables first when it is missing and we are root (the
#    partition case).
#    Extra args must be go test flags (no -args). The script fails if any
#    step failed. All steps use one race-built bridge binary
#    (DELAYBRIDGE_TEST_BRIDGE_BIN, see test/integration), linked once.
#
# Works on a fresh Debian 12 machine with Go in /usr/local/go; run it as root
# there (or with passwordless sudo) so that it can install what is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

section() { printf '\n==> %s\n' "$*"; }

# --- Go toolchain ---------------------------------------------------------------
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  PATH="/usr/local/go/bin:${PATH}"
fi
command -v go >/dev/null 2>&1 || { echo "ERROR: go not found (expected /usr/local/go/bin/go)" >&2; exit 1; }
GOBIN_DIR="$(go env GOPATH)/bin"
case ":${PATH}:" in *":${GOBIN_DIR}:"*) ;; *) PATH="${PATH}:${GOBIN_DIR}" ;; esac
export PATH

section "toolchain"
go version

# The race detector needs cgo and a C compiler.
RACE=(-race)
cc="$(go env CC)"
if ! command -v "${cc:-gcc}" >/dev/null 2>&1; then
  if [[ "$(id -u)" -eq 0 ]]; then
    echo "no C compiler (needed by go test -race); installing gcc and libc6-dev"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev
  else
    echo "WARNING: no C compiler and not root: running the tests WITHOUT -race" >&2
    RACE=()
  fi
fi
if [[ ${#RACE[@]} -gt 0 ]]; then export CGO_ENABLED=1; fi

# --- broker ---------------------------------------------------------------------
export DELAYBRIDGE_TEST_AMQP_URL="${DELAYBRIDGE_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
section "RabbitMQ ($(sed -E 's#(://[^:/@]*:)[^@]*@#\1***@#' <<<"${DELAYBRIDGE_TEST_AMQP_URL}"))"
bash ./scripts/ensure-rabbitmq.sh
section "PostgreSQL"
bash ./scripts/ensure-postgres.sh

# --- Node's amqplib, for the real-client test (test/integration/amqplib_test.go) ----------
# npm ci installs exactly the lockfile's versions; it runs again only when the
# lockfile changed since the last install (or node_modules is gone).
amqplib_dir="test/integration/amqplib"
if ! command -v npm >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  section "installing Node.js and npm (Debian packages)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
fi
if command -v npm >/dev/null 2>&1; then
  lock_sum="$(sha256sum "${amqplib_dir}/package-lock.json" | cut -d' ' -f1)"
  stamp="${amqplib_dir}/node_modules/.delaybridge-lock-sha256"
  if [[ ! -f "${stamp}" || "$(cat "${stamp}")" != "${lock_sum}" ]]; then
    section "npm ci (${amqplib_dir})"
    (cd "${amqplib_dir}" && npm ci --no-audit --no-fund --loglevel=error)
    echo "${lock_sum}" >"${stamp}"
  fi
else
  echo "WARNING: npm not found: the amqplib test is skipped (a failure under CI=true)" >&2
fi

# --- Chromium, for the status page's browser tests (test/integration/browser_test.go) ---
# Debian's chromium package; the tests drive it headless (chromedp). Without
# it they are skipped, which under CI=true is a failure: so is a chromium that
# cannot be installed here.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    section "installing chromium (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || true
  fi
  if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [[ "${CI:-}" == "true" ]]; then
      echo "ERROR: chromium could not be installed (CI=true: the status page must be checked in a browser)" >&2
      exit 1
    fi
    echo "WARNING: chromium not found: the status page's browser tests are skipped (a failure under CI=true)" >&2
  fi
fi

# --- disruptive tests: serial step, early ---------------------------------------------
read -r -a packages <<<"${DELAYBRIDGE_TEST_PACKAGES:-./...}"
work="$(mktemp -d)"
serial_pid=""
serial_log="${work}/serial.log"
cleanup() {
  # Never cut a disruptive test short: it puts the broker right when it ends.
  if [[ -n "${serial_pid}" ]]; then
    wait "${serial_pid}" 2>/dev/null || true
    section "serial step (disruptive tests), output"
    cat "${serial_log}"
  fi
  rm -rf "${work}"
}
trap cleanup EXIT
export DELAYBRIDGE_TEST_BRIDGE_BIN="${work}/delaybridge-race"
early="${work}/early"       # "<package dir>\t<test>": what the early serial step runs
deferred="${work}/deferred" # the same: what the main step skipped as disruptive
: >"${early}"
: >"${deferred}"

# run_serial LIST [extra go test args]: runs the tests of LIST's lines alone;
# -run and -p come after the extra args, so that they win.
run_serial() {
  local list="$1" names
  shift
  local dirs
  mapfile -t dirs < <(cut -f1 "${list}" | sort -u)
  names="$(cut -f2 "${list}" | sort -u | paste -sd '|' -)"
  echo "DELAYBRIDGE_TEST_DISRUPTIVE=1 go test ${RACE[*]} -count=1 -timeout 15m ${dirs[*]} $* -run '^(${names})\$' -p 1"
  DELAYBRIDGE_TEST_DISRUPTIVE=1 DELAYBRIDGE_TEST_DISRUPTIVE_DEFER="" \
    go test "${RACE[@]}" -count=1 -timeout 15m "${dirs[@]}" "$@" -run "^(${names})\$" -p 1
}

# run_serial_step LIST [extra go test args]: run_serial, with the three-node
# RabbitMQ cluster (scripts/rabbitmq-cluster.sh; test/integration/cluster_test.go)
# started first when LIST has a TestCluster* test, and stopped after. A
# cluster that cannot start leaves those tests to report it (a failure under
# CI=true).
run_serial_step() {
  local list="$1" rc=0 cluster=""
  shift
  if grep -q $'\tTestCluster' "${list}"; then
    cluster=1
    # The partition case cuts a node off with iptables (rabbitmq-cluster.sh
    # partition); without it that case reports it is unavailable.
    if ! command -v iptables >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "installing iptables (Debian package) for the cluster partition test"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null; } ||
        echo "WARNING: could not install iptables: the cluster partition test will say so" >&2
    fi
    local began=${SECONDS}
    if bash ./scripts/rabbitmq-cluster.sh start; then
      echo "three-node cluster started in $((SECONDS - began)) s"
    else
      echo "WARNING: the three-node cluster did not start: the cluster tests will say so" >&2
    fi
  fi
  run_serial "${list}" "$@" || rc=$?
  if [[ -n "${cluster}" ]]; then
    bash ./scripts/rabbitmq-cluster.sh stop || true
  fi
  return "${rc}"
}

if [[ $# -eq 0 ]]; then
  mapfile -t pkgdirs < <(go list -e -f '{{.Dir}}' "${packages[@]}" 2>/dev/null || true)
  for dir in "${pkgdirs[@]}"; do
    for f in "${dir}"/*_test.go; do
      [[ -f "${f}" ]] || continue
      awk -v dir="${dir}" '
        /^func / { name = "" }
        /^func Test[A-Za-z0-9_]*\(/ { name = $2; sub(/\(.*/, "", name) }
        /testenv\.Disruptive\(/ && name != "" { print dir "\t" name }
      ' "${f}"
    done
  done | sort -u >"${early}"
  if [[ -s "${early}" ]]; then
    section "serial step: $(cut -f2 "${early}" | paste -sd ' ' -), alone; its output follows go vet"
    serial_start=${SECONDS}
    run_serial_step "${early}" >"${serial_log}" 2>&1 &
    serial_pid=$!
  fi
fi

# --- format -----------------------------------------------------------------------
section "gofmt"
mapfile -t gofiles < <(find . -name '*.go' -not -path './.git/*' -not -path './vendor/*' -not -path '*/testdata/*' | sort)
if [[ ${#gofiles[@]} -gt 0 ]]; then
  unformatted="$(gofmt -l "${gofiles[@]}")"
  if [[ -n "${unformatted}" ]]; then
    echo "These files are not gofmt-formatted (fix with: gofmt -w <file>):" >&2
    echo "${unformatted}" >&2
    exit 1
  fi
fi
echo "ok (${#gofiles[@]} files)"

# --- vet ----------------------------------------------------------------------------
section "go vet ./..."
go vet ./...
echo "ok"
section "go vet ./... (bench/, the harness's module)"
go vet -C bench ./...
echo "ok"

# --- Helm chart ---------------------------------------------------------------------
# helm, pinned, from the Go module proxy (no other download needed): built once
# into $(go env GOPATH)/bin and reused after. The first build takes about
# 8 CPU-minutes (k8s.io/* included): some 4 to 5 minutes on 2 idle cores.
# DELAYBRIDGE_TEST_HELM names another binary. deploy/chart_test.go renders
# the chart and checks the manifests; here it is linted and rendered in both
# modes. Under CI=true a helm that cannot be installed is a failure.
HELM_VERSION="v3.22.0"
section "Helm chart (deploy/helm/delaybridge)"
if [[ -z "${DELAYBRIDGE_TEST_HELM:-}" ]]; then
  DELAYBRIDGE_TEST_HELM="${GOBIN_DIR}/helm"
  # The module version go install built (helm version says v3.22, not v3.22.0).
  built="$(go version -m "${DELAYBRIDGE_TEST_HELM}" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" { print $3 }' || true)"
  if [[ "${built}" != "${HELM_VERSION}" ]]; then
    echo "installing helm ${HELM_VERSION}: go install helm.sh/helm/v3/cmd/helm@${HELM_VERSION} (once; minutes)"
    helm_start=${SECONDS}
    if CGO_ENABLED=0 GOBIN="${GOBIN_DIR}" go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"; then
      echo "helm built in $((SECONDS - helm_start)) s"
    else
      DELAYBRIDGE_TEST_HELM=""
    fi
  fi
fi
if [[ -z "${DELAYBRIDGE_TEST_HELM}" ]]; then
  if [[ "${CI:-}" == "true" ]]; then
    echo "ERROR: helm could not be installed (CI=true: the chart must be checked)" >&2
    exit 1
  fi
  echo "WARNING: helm could not be installed: the chart is not checked (a failure under CI=true)" >&2
else
  export DELAYBRIDGE_TEST_HELM
  chart="deploy/helm/delaybridge"
  for mode in bbolt postgres; do
    "${DELAYBRIDGE_TEST_HELM}" lint --strict "${chart}" -f "${chart}/ci/${mode}-values.yaml"
    n="$("${DELAYBRIDGE_TEST_HELM}" template delaybridge "${chart}" -f "${chart}/ci/${mode}-values.yaml" | grep -c '^kind:')"
    echo "${mode}: helm template rendered ${n} manifests"
  done
fi

# --- test ---------------------------------------------------------------------------
serial_rc=0
if [[ -n "${serial_pid}" ]]; then
  wait "${serial_pid}" || serial_rc=$?
  serial_pid=""
  section "serial step (disruptive tests): took $((SECONDS - serial_start)) s in all, exit ${serial_rc}"
  cat "${serial_log}"
fi

# go test starts packages in the order given, -p (the number of cores) at a
# time. The integration tests take by far the longest (minutes, mostly
# waiting on bridges and the broker), so they go first: started last, as in
# ./... order, they would add the time of the packages before them.
main_pkgs=("${packages[@]}")
if go list -e "${packages[@]}" 2>/dev/null | grep -qx "$(go list -m)/test/integration"; then
  main_pkgs=(./test/integration "${packages[@]}")
fi
section "go test ${RACE[*]} -count=1 -timeout 15m ${main_pkgs[*]} $*"
echo "(the disruptive tests skip themselves here: they run alone, in a serial step)"
main_start=${SECONDS}
main_rc=0
DELAYBRIDGE_TEST_DISRUPTIVE="" DELAYBRIDGE_TEST_DISRUPTIVE_DEFER="${deferred}" \
  go test "${RACE[@]}" -count=1 -timeout 15m "${main_pkgs[@]}" "$@" || main_rc=$?
echo "main step: took $((SECONDS - main_start)) s, exit ${main_rc}"

# The harness's module: go test of the root module does not reach it. Its
# tests are short (seconds) and none is disruptive.
bench_rc=0
if [[ -z "${DELAYBRIDGE_TEST_PACKAGES:-}" ]]; then
  section "go test ${RACE[*]} -count=1 -timeout 15m ./... $* (bench/, the harness's module)"
  go test -C bench "${RACE[@]}" -count=1 -timeout 15m ./... "$@" || bench_rc=$?
fi

left="${work}/left"
sort -u "${deferred}" | comm -23 - <(sort -u "${early}") >"${left}"
tail_rc=0
if [[ -s "${left}" ]]; then
  section "serial step: the disruptive tests the main step deferred, alone"
  run_serial_step "${left}" "$@" || tail_rc=$?
fi

if [[ ${serial_rc} -ne 0 || ${main_rc} -ne 0 || ${bench_rc} -ne 0 || ${tail_rc} -ne 0 ]]; then
  echo "FAIL: serial step exit ${serial_rc}, main step exit ${main_rc}, bench module exit ${bench_rc}, last serial step exit ${tail_rc}" >&2
  exit 1
fi
