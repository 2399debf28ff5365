package cli

import (
	"flag"
	"fmt"
	"io"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// runDeclareQueue declares durable queues, so that "Try it in a minute"
// needs no management UI. A queue that exists already is left as it is,
// whatever its type and arguments.
func runDeclareQueue(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("declare-queue", flag.ContinueOnError)
	quorum := fs.Bool("quorum", false, "declare quorum queues (default: classic)")
	setUsage(fs, "declare-queue [--quorum] NAME...",
		`Declares each NAME as a durable queue on the broker at DELAYBRIDGE_AMQP_URL
(a destination for schedule, say). A queue that exists is left unchanged.`)
	pos, code := parseFlags(fs, args, out, errOut)
	if code >= 0 {
		return code
	}
	if len(pos) == 0 {
		return usageErr(fs, errOut, "declare-queue", "give at least one queue NAME")
	}
	for _, name := range pos {
		if err := wire.ValidateDestination("queue name", name); err != nil {
			return usageErr(fs, errOut, "declare-queue", "%v", err)
		}
	}
	_, conn, code := dialBroker("declare-queue", errOut)
	if code >= 0 {
		return code
	}
	defer conn.Close()
	var qargs amqp.Table
	if *quorum {
		qargs = amqp.Table{"x-queue-type": "quorum"}
	}
	for _, name := range pos {
		verb, err := declareQueue(conn, name, qargs)
		if err != nil {
			fmt.Fprintf(errOut, "delaybridge declare-queue: %s: %v\n", name, err)
			return exitCritical
		}
		fmt.Fprintf(out, "%s %s\n", verb, name)
	}
	return exitOK
}

// declareQueue declares queue name unless it exists; verb says which. A
// passive declare first, on a channel of its own (a missing queue closes
// it), so that an existing queue of another type or with other arguments is
// not an error.
func declareQueue(conn *amqp.Connection, name string, args amqp.Table) (verb string, err error) {
	exists, err := queueExists(conn, name)
	if err != nil || exists {
		return "exists", err
	}
	ch, err := conn.Channel()
	if err != nil {
		return "", err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		return "", err
	}
	return "declared", nil
}
