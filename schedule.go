package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/wire"
)

// runSchedule publishes one message to E.Timeouts: the quickest way to see
// the bridge work, and a reference for what clients send.
func runSchedule(args []string) int {
	fs := flag.NewFlagSet("schedule", flag.ContinueOnError)
	to := fs.String("to", "", "destination queue (required)")
	in := fs.Duration("in", 0, "deliver after this long, e.g. 10s (sent as x-delay)")
	at := fs.String("at", "", "deliver at this RFC 3339 time (sent as x-due-at)")
	id := fs.String("id", "", "message-id (default: assigned by the bridge)")
	contentType := fs.String("content-type", "text/plain", "content-type of the message")
	var headers headerFlags
	fs.Var(&headers, "header", "extra header name=value (repeatable)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: delaybridge schedule --to QUEUE (--in DURATION | --at TIME) [flags] BODY

Publishes BODY to E.Timeouts of the endpoint named by DELAYBRIDGE_ENDPOINT on the
broker at DELAYBRIDGE_AMQP_URL; the bridge delivers it to QUEUE when due.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitConfig
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "delaybridge schedule: "+format+"\n", a...)
		return exitConfig
	}
	if *to == "" {
		return fail("--to is required")
	}
	if (*in == 0) == (*at == "") {
		return fail("give exactly one of --in or --at")
	}
	if fs.NArg() > 1 {
		return fail("give the body as one argument (quote it)")
	}
	body := strings.Join(fs.Args(), "")

	h := amqp.Table{wire.HeaderDestination: *to}
	var due time.Time
	if *at != "" {
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return fail("--at %q is not an RFC 3339 time like 2026-11-21T20:00:00Z", *at)
		}
		h[wire.HeaderDueAt] = *at
		due = t
	} else {
		h[wire.HeaderDelay] = in.Milliseconds()
		due = time.Now().Add(*in)
	}
	for k, v := range headers {
		h[k] = v
	}

	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge: configuration:", err)
		return exitConfig
	}
	tlsCfg, err := cfg.TLSFiles().Config()
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge: configuration:", err)
		return exitConfig
	}
	conn, err := broker.Dial(cfg.AMQPURL, "delaybridge schedule", amqp.Config{TLSClientConfig: tlsCfg})
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge schedule:", err)
		return exitCritical
	}
	defer conn.Close()
	pub, err := broker.NewPublisher(conn, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge schedule:", err)
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
		fmt.Fprintf(os.Stderr, "delaybridge schedule: publish to %s: %v (is the bridge running? it declares the queue)\n", queue, res[0])
		return exitCritical
	}
	fmt.Printf("scheduled for %s at %s via %s\n", *to, due.Local().Format(time.RFC3339Nano), queue)
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
