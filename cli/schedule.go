package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/wire"
)

// runSchedule publishes one message to E.Timeouts: the quickest way to see
// the bridge work, and a reference for what clients send.
func runSchedule(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("schedule", flag.ContinueOnError)
	to := fs.String("to", "", "destination queue (required)")
	in := fs.Duration("in", 0, "deliver after this long from now, e.g. 10s (0 or more; sent as the absolute time x-due-at)")
	at := fs.String("at", "", "deliver at this RFC 3339 time, e.g. 2026-11-21T20:00:00Z (sent as x-due-at)")
	id := fs.String("id", "", "message-id (default: a new UUID)")
	contentType := fs.String("content-type", "text/plain", "content-type of the message")
	empty := fs.Bool("empty", false, "send an empty body (without it a missing BODY is an error)")
	noCheck := fs.Bool("no-check", false, "publish even if QUEUE does not exist now (it must by the due time)")
	var headers headerFlags
	fs.Var(&headers, "header", "extra header name=value (repeatable)")
	setUsage(fs, "schedule --to QUEUE (--in DURATION | --at TIME) [flags] (BODY | --empty)",
		`Publishes BODY to E.Timeouts of the endpoint named by DELAYBRIDGE_ENDPOINT on the
broker at DELAYBRIDGE_AMQP_URL, with its due time as an absolute x-due-at, and
waits for the broker's confirm; the bridge delivers it to QUEUE when due.
Prints the message id on stdout (and what was scheduled on stderr).
The destination queue must exist: delaybridge declare-queue QUEUE declares it.
A QUEUE that does not exist is refused (exit 1, nothing published) unless
--no-check is given.`)
	pos, code := parseFlags(fs, args, out, errOut)
	if code >= 0 {
		return code
	}
	fail := func(format string, a ...any) int { return usageErr(fs, errOut, "schedule", format, a...) }
	inSet := false
	fs.Visit(func(f *flag.Flag) { inSet = inSet || f.Name == "in" })
	switch {
	case *to == "":
		return fail("--to is required")
	case inSet == (*at != ""):
		return fail("give exactly one of --in or --at")
	case *in < 0:
		return fail("--in %s is negative: give how long from now (0 for now), or --at for a time", *in)
	case len(pos) > 1:
		return fail("give the body as one argument (quote it)")
	case len(pos) == 0 && !*empty:
		return fail("no BODY: give one, or --empty to send an empty body")
	case len(pos) == 1 && *empty:
		return fail("--empty and a BODY: give one or the other")
	}
	body := strings.Join(pos, "")

	// An absolute due time, computed here: an x-delay would count from when
	// the bridge takes the message in, so time spent queued on E.Timeouts
	// (a bridge that is down or behind) would push the delivery later.
	due := time.Now().Add(*in)
	if *at != "" {
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return fail("--at %q is not an RFC 3339 time like 2026-11-21T20:00:00Z", *at)
		}
		due = t
	}
	h := amqp.Table{}
	for k, v := range headers {
		h[k] = v
	}
	h[wire.HeaderDestination] = *to
	h[wire.HeaderDueAt] = due.Format(time.RFC3339Nano)
	if *id == "" {
		*id = uuid.NewString()
	}

	cfg, conn, code := dialBroker("schedule", errOut)
	if code >= 0 {
		return code
	}
	defer conn.Close()
	if !*noCheck {
		// A missing destination would surface only at the due time, as
		// retries and then a copy on the error queue: say so now.
		exists, err := queueExists(conn, *to)
		if err != nil {
			fmt.Fprintf(errOut, "delaybridge schedule: check queue %q: %v\n", *to, err)
			return exitCritical
		}
		if !exists {
			fmt.Fprintf(errOut, "delaybridge schedule: queue %q does not exist, so nothing was scheduled; declare it (delaybridge declare-queue %s), or give --no-check if it will exist by the due time\n", *to, *to)
			return exitCritical
		}
	}
	pub, err := broker.NewPublisher(conn, 1)
	if err != nil {
		fmt.Fprintln(errOut, "delaybridge schedule:", err)
		return exitCritical
	}
	queue := broker.Topology{Endpoint: cfg.Endpoint}.TimeoutsQueue()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := pub.Publish(ctx, []broker.Outgoing{{RoutingKey: queue, Mandatory: true, Msg: amqp.Publishing{
		Headers: h, ContentType: *contentType, DeliveryMode: amqp.Persistent, MessageId: *id,
		Timestamp: time.Now(), Body: []byte(body),
	}}})
	if res[0] != nil {
		fmt.Fprintf(errOut, "delaybridge schedule: publish to %s: %v (is the bridge running? it declares the queue)\n", queue, res[0])
		return exitCritical
	}
	fmt.Fprintln(out, *id)
	fmt.Fprintf(errOut, "scheduled %s for %s at %s via %s\n", *id, *to, fmtTime(due), queue)
	return exitOK
}

type headerFlags map[string]any

func (h *headerFlags) String() string { return "" }

func (h *headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=value, got %q", v)
	}
	if *h == nil {
		*h = headerFlags{}
	}
	(*h)[name] = value
	return nil
}
