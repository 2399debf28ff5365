package cli

import (
	"errors"
	"fmt"
	"io"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
)

// The broker connection of the client commands schedule and declare-queue.

// dialBroker connects to the broker of DELAYBRIDGE_AMQP_URL (TLS variables
// honoured) for client command cmd. code < 0: go on; otherwise the error is
// printed and code is the exit code.
func dialBroker(cmd string, errOut io.Writer) (cfg config.Config, conn *amqp.Connection, code int) {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(errOut, "delaybridge: configuration:", err)
		return cfg, nil, exitConfig
	}
	tlsCfg, err := cfg.TLSFiles().Config()
	if err != nil {
		fmt.Fprintln(errOut, "delaybridge: configuration:", err)
		return cfg, nil, exitConfig
	}
	conn, err = broker.Dial(cfg.AMQPURL, "delaybridge "+cmd, amqp.Config{TLSClientConfig: tlsCfg})
	if err != nil {
		fmt.Fprintf(errOut, "delaybridge %s: %v\n", cmd, err)
		return cfg, nil, exitCritical
	}
	return cfg, conn, -1
}

// queueExists asks the broker with a passive declare, on a channel of its
// own: a missing queue closes the channel.
func queueExists(conn *amqp.Connection, name string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	_, err = ch.QueueDeclarePassive(name, false, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		ch.Close()
		return true, nil
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return false, nil
	default:
		return false, err
	}
}
