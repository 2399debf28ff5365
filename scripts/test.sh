#!/usr/bin/env bash
# The project's test command: ./scripts/test.sh [extra go test args]
#
#   ./scripts/test.sh                      # everything
#   ./scripts/test.sh -run TestStore -v    # extra args go to `go test`
#   DELAYBRIDGE_TEST_PACKAGES=./storage/... ./scripts/test.sh
#
# 1. makes sure RabbitMQ answers at $DELAYBRIDGE_TEST_AMQP_URL
#    (default amqp://guest:guest@127.0.0.1:5672/; a local broker is installed
#    and started when needed, see scripts/ensure-rabbitmq.sh), and PostgreSQL
#    at $DELAYBRIDGE_TEST_POSTGRES_URL (see scripts/ensure-postgres.sh),
# 2. checks formatting (gofmt -l),
# 3. go vet ./...,
# 4. go test -race -count=1 -timeout 15m $DELAYBRIDGE_TEST_PACKAGES "$@".
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

# --- test ---------------------------------------------------------------------------
read -r -a packages <<<"${DELAYBRIDGE_TEST_PACKAGES:-./...}"
section "go test ${RACE[*]} -count=1 -timeout 15m ${packages[*]} $*"
go test "${RACE[@]}" -count=1 -timeout 15m "${packages[@]}" "$@"
