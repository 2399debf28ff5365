package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// amqplibDir is the npm project of the amqplib check (scripts/test.sh runs
// npm ci there).
const amqplibDir = "amqplib"

// amqplibPlan is what check.js publishes and consumes.
type amqplibPlan struct {
	URL      string              `json:"url"`
	Exchange string              `json:"exchange"`
	Bindings []amqplibBinding    `json:"bindings"`
	Messages []amqplibMessage    `json:"messages"`
	Expect   int                 `json:"expect"` // deliveries in all
	WaitMs   int                 `json:"waitMs"`
	QuietMs  int                 `json:"quietMs"`
	want     map[string][]string // message id: the bindings it must reach
}

type amqplibBinding struct {
	Name    string `json:"name"`
	Pattern string `json:"pattern"`
}

type amqplibMessage struct {
	ID         string `json:"id"`
	RoutingKey string `json:"routingKey"`
	DelayType  string `json:"delayType"` // number, double, string, void, none
	Delay      any    `json:"delay"`
	Body       string `json:"body"`
	ms         int    // the delay it means; 0: at once
}

// amqplibResult is what check.js reports.
type amqplibResult struct {
	Received []struct {
		Queue      string   `json:"queue"`
		ID         string   `json:"id"`
		Exchange   string   `json:"exchange"`
		RoutingKey string   `json:"routingKey"`
		Body       string   `json:"body"`
		HasXDelay  bool     `json:"hasXDelay"`
		XDelay     any      `json:"xDelay"`
		ElapsedMs  *float64 `json:"elapsedMs"`
	} `json:"received"`
	Returned []string `json:"returned"`
}

// TestAmqplibDelayedTopicExchange drives a delayed topic exchange with
// Node's amqplib, a client nobody here wrote, the way code written for the
// delayed-message-exchange plugin does: it publishes to the exchange with
// routing keys and x-delay (as amqplib encodes a JS number, a double, a
// string, null) and consumes through pattern bindings on <name>.route.
// Every message reaches exactly the queues its key matches, never before
// its delay (timed in the Node process on one monotonic clock), with key
// and body intact and x-delay negated; one without x-delay comes at once,
// straight from the broker.
func TestAmqplibDelayedTopicExchange(t *testing.T) {
	t.Parallel()
	node := amqplibNode(t)

	name := delayedExchange(t, "amqplib")
	startBridge(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic", "DELAYBRIDGE_POLL_INTERVAL": "100ms"})

	plan := amqplibPlan{URL: amqpURL, Exchange: name, WaitMs: 30000, QuietMs: int(quietPeriod / time.Millisecond),
		Bindings: []amqplibBinding{{"orders", "orders.*"}, {"eu", "#.eu"}, {"all", "#"}},
		want:     map[string][]string{}}
	add := func(id, key, delayType string, delay any, ms int, queues ...string) {
		plan.Messages = append(plan.Messages, amqplibMessage{ID: id, RoutingKey: key, DelayType: delayType, Delay: delay,
			Body: "body of " + id + " ✓", ms: ms})
		plan.want[id] = queues
		plan.Expect += len(queues)
	}
	add("now", "orders.now", "none", nil, 0, "orders", "all")
	add("short", "orders.created", "number", 1500, 1500, "orders", "all") // amqplib sends a signed 16-bit integer
	add("byte", "audit.eu", "number", 100, 100, "eu", "all")              // a signed 8-bit integer
	add("int", "payments.eu", "number", 2500, 2500, "eu", "all")
	add("string", "orders.eu", "string", 1000, 1000, "orders", "eu", "all")
	add("double", "orders.float", "double", 1200.7, 1200, "orders", "all")
	add("void", "orders.void", "void", nil, 0, "orders", "all")
	add("negative", "orders.neg", "number", -500, 0, "orders", "all")
	add("long", "shipping.eu.late", "number", 70000, 70000, "all") // a 32-bit integer; not waited for
	plan.Expect -= len(plan.want["long"])

	var res amqplibResult
	stderr := runNode(t, node, "check.js", plan, &res)
	if len(res.Returned) > 0 {
		t.Errorf("the broker returned %v as unroutable", res.Returned)
	}

	got := map[string][]string{}
	for _, r := range res.Received {
		got[r.ID] = append(got[r.ID], r.Queue)
		m := plan.message(r.ID)
		if m == nil {
			t.Errorf("%s received on %s: never published", r.ID, r.Queue)
			continue
		}
		what := fmt.Sprintf("%s on %s", r.ID, r.Queue)
		if r.RoutingKey != m.RoutingKey || r.Body != m.Body {
			t.Errorf("%s: routing key %q body %q, want %q %q", what, r.RoutingKey, r.Body, m.RoutingKey, m.Body)
		}
		if r.ElapsedMs == nil {
			t.Errorf("%s: no publish time", what)
			continue
		}
		elapsed := time.Duration(*r.ElapsedMs * float64(time.Millisecond))
		if elapsed < time.Duration(m.ms)*time.Millisecond {
			t.Errorf("%s arrived EARLY: %s after its publish, delay %d ms", what, elapsed, m.ms)
		}
		switch m.DelayType {
		case "none":
			// The broker routed it through <name>.route itself.
			if r.Exchange != name || r.HasXDelay {
				t.Errorf("%s: came through %q with x-delay %v; want %q, without x-delay", what, r.Exchange, r.XDelay, name)
			}
			if elapsed > livenessBound {
				t.Errorf("%s: took %s, not at once", what, elapsed)
			}
		case "void":
			if r.Exchange != name+".route" || !r.HasXDelay || r.XDelay != nil {
				t.Errorf("%s: came through %q with x-delay %v (present %v); want %q and a void x-delay", what, r.Exchange, r.XDelay, r.HasXDelay, name+".route")
			}
		default:
			want := -float64(m.ms) // the plugin's mark: the delay, negated
			if m.ms == 0 {
				want = float64(m.Delay.(int)) // not delayed: as it came
			}
			if r.Exchange != name+".route" || r.XDelay != want {
				t.Errorf("%s: came through %q with x-delay %v; want %q and %v", what, r.Exchange, r.XDelay, name+".route", want)
			}
		}
	}
	for id, queues := range plan.want {
		if id == "long" {
			queues = nil // 70 s out: must not have arrived
		}
		have := slices.Clone(got[id])
		slices.Sort(have)
		want := slices.Clone(queues)
		slices.Sort(want)
		if !slices.Equal(have, want) {
			t.Errorf("%s (key %q) reached [%s], want [%s]", id, plan.message(id).RoutingKey, strings.Join(have, " "), strings.Join(want, " "))
		}
	}
	t.Logf("%d deliveries; node stderr: %s", len(res.Received), stderr)
}

// amqplibNode returns the node binary once node and amqplib are there; the
// test is Unavailable otherwise.
func amqplibNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	testenv.Require(t, err == nil, "node is not installed (Node 18 or later runs the amqplib check): %v", err)
	_, err = os.Stat(filepath.Join(amqplibDir, "node_modules", "amqplib", "package.json"))
	testenv.Require(t, err == nil, "amqplib is not installed: run npm ci in test/integration/%s (scripts/test.sh does): %v", amqplibDir, err)
	return node
}

// runNode runs script of the amqplib project with plan as JSON on stdin and
// decodes the JSON it prints into res. It returns what the script wrote to
// stderr.
func runNode(t *testing.T, node, script string, plan, res any) string {
	t.Helper()
	in, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = amqplibDir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), res); err != nil {
		t.Fatalf("node %s printed no result: %v\nstdout:\n%s\nstderr:\n%s", script, err, stdout.String(), stderr.String())
	}
	return stderr.String()
}

func (p *amqplibPlan) message(id string) *amqplibMessage {
	for i := range p.Messages {
		if p.Messages[i].ID == id {
			return &p.Messages[i]
		}
	}
	return nil
}
