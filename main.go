// Command delaybridge gives an AMQP endpoint durable delayed delivery: it
// consumes E.Timeouts, stores each message until its due time and then
// forwards it to its destination queue. Its commands are in package cli.
package main

import (
	"os"

	"github.com/delaybridge/delaybridge/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}
