#!/usr/bin/env bash
# Render the status page (GET /) in headless Chromium and save a screenshot.
#
#   ./scripts/screenshot.sh [OUT.png]        # default docs/status.png
#
# Builds the binary, starts a bridge with a temporary store on a free port
# against the broker at $DELAYBRIDGE_AMQP_URL (default the local one),
# schedules a few messages (some delivered while it runs, some due in an hour
# so the "next due" table has rows, one to a missing queue so a retry shows),
# waits for the throughput sampler, takes the screenshot with Debian's
# chromium package, stops the bridge and deletes the queues it declared
# (with rabbitmqctl, when the broker is local).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-docs/status.png}"
export DELAYBRIDGE_AMQP_URL="${DELAYBRIDGE_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
[ -n "$CHROMIUM" ] || { echo "screenshot: chromium not found (apt-get install -y chromium)" >&2; exit 1; }

work="$(mktemp -d)"
EP="status-shot-$$-$RANDOM"
# The bridge declares E.Timeouts, E.TimeoutsDispatcher and its error queue;
# the error queue doubles as the existing destination "E.orders" here.
DEST="$EP.orders"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  if command -v rabbitmqctl >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmqctl ]; then
    for q in "$EP.Timeouts" "$EP.TimeoutsDispatcher" "$DEST"; do
      PATH="$PATH:/usr/sbin" rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
    done
  else
    echo "screenshot: delete the queues $EP.Timeouts, $EP.TimeoutsDispatcher and $DEST by hand" >&2
  fi
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/delaybridge" .
export DELAYBRIDGE_ENDPOINT="$EP" DELAYBRIDGE_ERROR_QUEUE="$DEST" DELAYBRIDGE_NUMBER_OF_RETRIES=50
DELAYBRIDGE_STORE_PATH="$work/store.db" DELAYBRIDGE_HTTP_ADDR="127.0.0.1:$PORT" DELAYBRIDGE_LOG_FORMAT=json \
  "$work/delaybridge" >"$work/bridge.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { cat "$work/bridge.log" >&2; exit 1; }

sched() { "$work/delaybridge" schedule "$@" >/dev/null; }
# Delivered during the run: the throughput table gets rates and lateness.
for i in $(seq 1 24); do sched --to "$DEST" --in "$((i % 12 + 1))s" --id "order-$((1000 + i))-reminder" "{\"order\":$((1000 + i))}"; done
# Still pending when the screenshot is taken.
for i in 1 2 3 4 5 6; do sched --to "$DEST" --in "$((i * 7))m" --id "invoice-$((2040 + i))-due" '{}'; done
sched --to "$EP.billing" --in 1s --id "billing-77-retry" '{}' # no such queue: retried with backoff
sched --to "$DEST" --at 2027-01-01T00:00:00Z --id "new-year-greeting" 'happy new year'
sched --to "$DEST" --in 3h --id '<script>alert("escaped")</script>' 'user data is escaped'

# Two samples 10 s apart at least, and the deliveries above.
sleep "${SCREENSHOT_WAIT:-25}"

mkdir -p "$(dirname "$OUT")"
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$work/chromium" --window-size=1280,1100 --hide-scrollbars \
  --screenshot="$OUT" "http://127.0.0.1:$PORT/" >"$work/chromium.log" 2>&1 ||
  { cat "$work/chromium.log" >&2; exit 1; }
echo "screenshot: wrote $OUT"
