#!/usr/bin/env bash
# Render the status page (GET /) in headless Chromium and save screenshots.
#
#   ./scripts/screenshot.sh                      # both: docs/status.png and docs/status-failing.png
#   ./scripts/screenshot.sh OUT.png [healthy|failing]
#
# Builds the binary, starts a bridge with a temporary store on a free port
# against the broker at $DELAYBRIDGE_AMQP_URL (default the local one),
# schedules a few messages (some delivered while it runs, some due later so
# the pending table has rows) and, in the failing scenario, a stream of
# messages to a queue that does not exist (retried, then moved to the error
# queue: the badge says "attention" with the failing destination), waits for
# the throughput sampler, takes the screenshot with Debian's chromium
# package, stops the bridge and deletes the queues it declared (with
# rabbitmqctl, when the broker is local).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -eq 0 ]; then
  "$0" docs/status.png healthy
  exec "$0" docs/status-failing.png failing
fi
OUT="$1"
SCENARIO="${2:-healthy}"
case "$SCENARIO" in healthy | failing) ;; *) echo "screenshot: scenario must be healthy or failing" >&2; exit 2 ;; esac
export DELAYBRIDGE_AMQP_URL="${DELAYBRIDGE_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
[ -n "$CHROMIUM" ] || { echo "screenshot: chromium not found (apt-get install -y chromium)" >&2; exit 1; }

work="$(mktemp -d)"
EP="status-shot-$$-$RANDOM"
DEST="$EP.orders"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  if command -v rabbitmqctl >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmqctl ]; then
    for q in "$EP.Timeouts" "$EP.TimeoutsDispatcher" "$EP.error" "$DEST"; do
      PATH="$PATH:/usr/sbin" rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
    done
  else
    echo "screenshot: delete the queues $EP.Timeouts, $EP.TimeoutsDispatcher, $EP.error and $DEST by hand" >&2
  fi
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/delaybridge" .
export DELAYBRIDGE_ENDPOINT="$EP" DELAYBRIDGE_ERROR_QUEUE="$EP.error" DELAYBRIDGE_NUMBER_OF_RETRIES=2
# The login form shows (the token is never on the page).
DELAYBRIDGE_ADMIN_TOKEN="screenshot-$RANDOM$RANDOM" \
DELAYBRIDGE_STORE_PATH="$work/store.db" DELAYBRIDGE_HTTP_ADDR="127.0.0.1:$PORT" DELAYBRIDGE_LOG_FORMAT=json \
  "$work/delaybridge" >"$work/bridge.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { cat "$work/bridge.log" >&2; exit 1; }
"$work/delaybridge" declare-queue "$DEST" >/dev/null

sched() { "$work/delaybridge" schedule "$@" >/dev/null 2>"$work/schedule.err" || { cat "$work/schedule.err" >&2; return 1; }; }
# Delivered during the run: the throughput table gets rates and lateness.
for i in $(seq 1 24); do sched --to "$DEST" --in "$((i % 12 + 1))s" --id "order-$((1000 + i))-reminder" "{\"order\":$((1000 + i))}"; done
# Still pending when the screenshot is taken.
for i in 1 2 3 4 5 6; do sched --to "$DEST" --in "$((i * 7))m" --id "invoice-$((2040 + i))-due" '{}'; done
sched --to "$DEST" --at 2027-01-01T00:00:00Z --id "new-year-greeting" 'happy new year'
sched --to "$DEST" --in 3h --id '<script>alert("escaped")</script>' 'user data is escaped'
if [ "$SCENARIO" = failing ]; then
  # No such queue: returned, retried twice with backoff, then moved to the
  # error queue; due over the whole wait, so some are still retrying.
  for i in $(seq 1 12); do sched --to "$EP.billing" --in "$((i * 3))s" --id "billing-$((70 + i))-charge" '{}'; done
fi

# Two samples 10 s apart at least, and the deliveries above.
sleep "${SCREENSHOT_WAIT:-25}"

mkdir -p "$(dirname "$OUT")"
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$work/chromium" --window-size=1280,"${SCREENSHOT_HEIGHT:-1800}" --hide-scrollbars \
  --screenshot="$OUT" "http://127.0.0.1:$PORT/" >"$work/chromium.log" 2>&1 ||
  { cat "$work/chromium.log" >&2; exit 1; }
echo "screenshot: wrote $OUT ($SCENARIO)"
