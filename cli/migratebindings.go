package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/management"
	"github.com/delaybridge/delaybridge/protocol/delayed"
	"github.com/delaybridge/delaybridge/wire"
)

// migrateTimeout bounds one migrate-bindings run.
const migrateTimeout = 2 * time.Minute

// stringsFlag is a repeatable flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, ",") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

// runMigrateBindings is `delaybridge migrate-bindings --exchange NAME
// [--apply]`: it moves the bindings a delayed exchange has besides the
// bridge's own to the exchange's routing exchange, through the RabbitMQ
// management API (docs/contract.md §5.5).
func runMigrateBindings(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("migrate-bindings", flag.ContinueOnError)
	var exchanges stringsFlag
	fs.Var(&exchanges, "exchange", "a delayed exchange of DELAYBRIDGE_DELAYED_EXCHANGES whose other bindings to move (repeat for several)")
	apply := fs.Bool("apply", false, "move the bindings; without it nothing is changed, the plan is only printed")
	mgmtURL := fs.String("management-url", "", "the RabbitMQ management API, http(s)://[user:password@]host:port/ (default: $DELAYBRIDGE_MANAGEMENT_URL, else port 15672 of DELAYBRIDGE_AMQP_URL's host; the user and password of DELAYBRIDGE_AMQP_URL unless the URL has its own)")
	setUsage(fs, "migrate-bindings --exchange NAME [--exchange NAME]... [--apply]",
		`Moves the bindings of a delayed exchange NAME other than the bridge's own (its binding to
E.Timeouts) to NAME.route, where consumers bind: each is created on NAME.route with the same
destination, routing key and arguments, then removed from NAME. A binding left on NAME gets every
message published to it at once, delays ignored, and keeps messages without x-delay from NAME.route.
Without --apply it only prints what it would move. Running it again moves nothing more. It uses the
management HTTP API (the rabbitmq_management plugin) on the vhost of DELAYBRIDGE_AMQP_URL, and
DELAYBRIDGE_ENDPOINT to know the bridge's own binding.`)
	pos, code := parseFlags(fs, args, out, errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return usageErr(fs, errOut, "migrate-bindings", "unexpected argument %q: name the exchanges with --exchange", pos[0])
	}
	if len(exchanges) == 0 {
		return usageErr(fs, errOut, "migrate-bindings", "name a delayed exchange with --exchange")
	}
	for _, x := range exchanges {
		if err := wire.ValidateExchange("--exchange", x); err != nil {
			return usageErr(fs, errOut, "migrate-bindings", "%v", err)
		}
	}
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(errOut, "delaybridge: configuration:", err)
		return exitConfig
	}
	tlsCfg, err := cfg.TLSFiles().Config()
	if err != nil {
		fmt.Fprintln(errOut, "delaybridge: configuration:", err)
		return exitConfig
	}
	if *mgmtURL == "" {
		*mgmtURL = cfg.ManagementURL
	}
	c, err := management.New(*mgmtURL, cfg.AMQPURL, tlsCfg)
	if err != nil {
		return usageErr(fs, errOut, "migrate-bindings", "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	m := migration{c: c, timeoutsQueue: wire.TimeoutsQueue(cfg.Endpoint), apply: *apply, out: out}
	for _, x := range exchanges {
		if err := m.run(ctx, x); err != nil {
			fmt.Fprintf(errOut, "delaybridge migrate-bindings: %v\n", explainManagement(err, c))
			return exitCritical
		}
	}
	if !*apply {
		fmt.Fprintln(out, "dry run: nothing was changed; run again with --apply to move them")
	}
	return exitOK
}

// migration moves one delayed exchange's foreign bindings.
type migration struct {
	c             *management.Client
	timeoutsQueue string
	apply         bool
	out           io.Writer
}

func (m migration) run(ctx context.Context, name string) error {
	route := wire.DelayedRoute(name)
	x, err := m.c.Exchange(ctx, name)
	if err != nil {
		return fmt.Errorf("exchange %q: %w", name, err)
	}
	if ae, _ := x.Arguments["alternate-exchange"].(string); x.Type != "headers" || ae != route {
		hint := "start the bridge with it in DELAYBRIDGE_DELAYED_EXCHANGES first (docs/contract.md §2.7)"
		if x.Type == "x-delayed-message" {
			hint = "it is still the delayed-message-exchange plugin's exchange: drain it, delete it and start the bridge with it in DELAYBRIDGE_DELAYED_EXCHANGES (docs/protocols/delayed-exchange.md)"
		}
		return fmt.Errorf("exchange %q on vhost %q is not a delayed exchange of the bridge (it is a %s exchange, alternate-exchange %q; the bridge's is a headers exchange whose alternate exchange is %q): %s",
			name, m.c.Vhost(), x.Type, ae, route, hint)
	}
	if _, err := m.c.Exchange(ctx, route); err != nil {
		return fmt.Errorf("its routing exchange %q: %w", route, err)
	}
	bs, err := m.c.BindingsFrom(ctx, name)
	if err != nil {
		return fmt.Errorf("the bindings of %q: %w", name, err)
	}
	var foreign []management.Binding
	for _, b := range bs {
		isQueue := b.DestinationType == "queue"
		if delayed.OwnBinding(m.timeoutsQueue, isQueue, b.Destination, b.Arguments) {
			continue
		}
		if delayed.BindingArgs(b.Arguments) {
			// A bridge's binding, of another endpoint: moving it would send
			// every message of the routing exchange to that bridge.
			return fmt.Errorf("exchange %q has a bridge's binding to %s %q, not to this endpoint's %q: "+
				"set DELAYBRIDGE_ENDPOINT to the endpoint of the bridge that serves %q (two bridges must not share a delayed exchange); nothing was moved",
				name, b.DestinationType, b.Destination, m.timeoutsQueue, name)
		}
		foreign = append(foreign, b)
	}
	if len(foreign) == 0 {
		fmt.Fprintf(m.out, "exchange %q: nothing to move (no binding but the bridge's own)\n", name)
		return nil
	}
	verb := "to move"
	if m.apply {
		verb = "moving"
	}
	fmt.Fprintf(m.out, "exchange %q: %d binding(s) %s to %q:\n", name, len(foreign), verb, route)
	for _, b := range foreign {
		fmt.Fprintf(m.out, "  %s\n", b)
	}
	if !m.apply {
		return nil
	}
	for _, b := range foreign {
		moved := b
		moved.Source = route
		// First the new binding, then the old one's removal: in between a
		// message may reach the destination twice, never not at all.
		if err := m.c.Bind(ctx, moved); err != nil {
			return fmt.Errorf("bind %s to %q: %w", b, route, err)
		}
		if err := m.c.Unbind(ctx, b); err != nil && !errors.Is(err, management.ErrNotFound) {
			return fmt.Errorf("remove %s from %q (it is on %q already): %w", b, name, route, err)
		}
		fmt.Fprintf(m.out, "moved %s from %q to %q\n", b, name, route)
	}
	return nil
}

// explainManagement adds to a management API error what to do about it.
func explainManagement(err error, c *management.Client) string {
	switch {
	case errors.Is(err, management.ErrUnreachable):
		return err.Error() + ": is the management plugin enabled (rabbitmq-plugins enable rabbitmq_management)? Otherwise give its URL with --management-url or DELAYBRIDGE_MANAGEMENT_URL"
	case errors.Is(err, management.ErrUnauthorized), errors.Is(err, management.ErrForbidden):
		// RabbitMQ answers 401 for a wrong password, a user without a
		// management tag and a missing permission alike; its reason says which.
		return fmt.Sprintf("%v: the user needs the management tag (or monitoring, policymaker, administrator) to use the API, "+
			"and on vhost %q read permission on the delayed exchange and its routing exchange and write permission on each "+
			"destination to move a binding; give another user with --management-url http://user:password@host:15672/", err, c.Vhost())
	case errors.Is(err, management.ErrNotFound):
		return err.Error() + " (check the exchange's name and the vhost of DELAYBRIDGE_AMQP_URL)"
	}
	return err.Error()
}
