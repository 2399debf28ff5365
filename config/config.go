// Package config reads the bridge's environment variables (docs/contract.md §5).
// Only the process entry, package cli, reads it; components receive their own
// small option structs.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kelseyhightower/envconfig"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/protocol/delayed"
	"github.com/delaybridge/delaybridge/wire"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// AMQPURLs returns the brokers to connect to, in the order they are tried:
// DELAYBRIDGE_AMQP_URL first, then DELAYBRIDGE_AMQP_FAILOVER_URLS.
func (c Config) AMQPURLs() []string {
	urls := []string{c.AMQPURL}
	for _, u := range c.AMQPFailoverURLs {
		urls = append(urls, strings.TrimSpace(u))
	}
	return urls
}

// TLSFiles returns the DELAYBRIDGE_TLS_* settings (amqps:// only).
func (c Config) TLSFiles() broker.TLSFiles {
	return broker.TLSFiles{CAFile: c.TLSCAFile, CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ServerName: c.TLSServerName}
}

// Config mirrors docs/contract.md §5; each field's tag is its variable's full name.
type Config struct {
	AMQPURL                          string        `envconfig:"DELAYBRIDGE_AMQP_URL" default:"amqp://guest:guest@localhost:5672/"`
	AMQPFailoverURLs                 []string      `envconfig:"DELAYBRIDGE_AMQP_FAILOVER_URLS"`
	TLSCAFile                        string        `envconfig:"DELAYBRIDGE_TLS_CA_FILE"`
	TLSCertFile                      string        `envconfig:"DELAYBRIDGE_TLS_CERT_FILE"`
	TLSKeyFile                       string        `envconfig:"DELAYBRIDGE_TLS_KEY_FILE"`
	TLSServerName                    string        `envconfig:"DELAYBRIDGE_TLS_SERVER_NAME"`
	Endpoint                         string        `envconfig:"DELAYBRIDGE_ENDPOINT" default:"delaybridge"`
	ErrorQueue                       string        `envconfig:"DELAYBRIDGE_ERROR_QUEUE" default:"error"`
	Store                            string        `envconfig:"DELAYBRIDGE_STORE" default:"bbolt"`
	StorePath                        string        `envconfig:"DELAYBRIDGE_STORE_PATH" default:"./data/delaybridge.db"`
	PostgresURL                      string        `envconfig:"DELAYBRIDGE_POSTGRES_URL"`
	PostgresSchema                   string        `envconfig:"DELAYBRIDGE_POSTGRES_SCHEMA" default:"delaybridge"`
	HTTPAddr                         string        `envconfig:"DELAYBRIDGE_HTTP_ADDR" default:":8080"`
	PollInterval                     time.Duration `envconfig:"DELAYBRIDGE_POLL_INTERVAL" default:"1s"`
	MisfireThreshold                 time.Duration `envconfig:"DELAYBRIDGE_MISFIRE_THRESHOLD" default:"60s"`
	BatchSize                        int           `envconfig:"DELAYBRIDGE_BATCH_SIZE" default:"1000"`
	LockLeaseDuration                time.Duration `envconfig:"DELAYBRIDGE_LOCK_LEASE_DURATION" default:"5m"`
	Prefetch                         int           `envconfig:"DELAYBRIDGE_PREFETCH" default:"500"`
	NumberOfRetries                  int           `envconfig:"DELAYBRIDGE_NUMBER_OF_RETRIES" default:"5"`
	TimeToTriggerStoreCircuitBreaker time.Duration `envconfig:"DELAYBRIDGE_TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER" default:"30s"`
	TimeToTriggerFetchCircuitBreaker time.Duration `envconfig:"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER" default:"30s"`
	TimeToTriggerDispatchBreaker     time.Duration `envconfig:"DELAYBRIDGE_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER" default:"30s"`
	MaxRecoveryFailuresPerSecond     int           `envconfig:"DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND" default:"1"`
	MaxDelay                         time.Duration `envconfig:"DELAYBRIDGE_MAX_DELAY" default:"0"`
	MaxMessageBytes                  int           `envconfig:"DELAYBRIDGE_MAX_MESSAGE_BYTES" default:"16777216"`
	MaxInflightBytes                 int64         `envconfig:"DELAYBRIDGE_MAX_INFLIGHT_BYTES" default:"67108864"`
	AllowedDestinations              []string      `envconfig:"DELAYBRIDGE_ALLOWED_DESTINATIONS" default:"*"`
	DelayedExchanges                 []string      `envconfig:"DELAYBRIDGE_DELAYED_EXCHANGES"`
	NSBNativeDelays                  bool          `envconfig:"DELAYBRIDGE_NSB_NATIVE_DELAYS" default:"false"`
	AdminToken                       string        `envconfig:"DELAYBRIDGE_ADMIN_TOKEN"`
	AdminTokenFile                   string        `envconfig:"DELAYBRIDGE_ADMIN_TOKEN_FILE" default:"./data/admin-token"`
	QueueType                        string        `envconfig:"DELAYBRIDGE_QUEUE_TYPE" default:"classic"`
	RebusQueue                       string        `envconfig:"DELAYBRIDGE_REBUS_QUEUE"`
	RebusDirectExchange              string        `envconfig:"DELAYBRIDGE_REBUS_DIRECT_EXCHANGE" default:"RebusDirect"`
	RebusDirectExchangeArgs          []string      `envconfig:"DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS"`
	ManagementURL                    string        `envconfig:"DELAYBRIDGE_MANAGEMENT_URL"`
	BindingCheckInterval             time.Duration `envconfig:"DELAYBRIDGE_BINDING_CHECK_INTERVAL" default:"1m"`
	MassTransitQueue                 string        `envconfig:"DELAYBRIDGE_MASSTRANSIT_QUEUE"`
	LogLevel                         string        `envconfig:"DELAYBRIDGE_LOG_LEVEL" default:"info"`
	LogFormat                        string        `envconfig:"DELAYBRIDGE_LOG_FORMAT" default:"json"`
	Pprof                            bool          `envconfig:"DELAYBRIDGE_PPROF" default:"false"`
	MetricsMaxDestinations           int           `envconfig:"DELAYBRIDGE_METRICS_MAX_DESTINATIONS" default:"50"`
	MetricsDestinationInterval       time.Duration `envconfig:"DELAYBRIDGE_METRICS_DESTINATION_INTERVAL" default:"15s"`
}

// DefaultAdminTokenFile is DELAYBRIDGE_ADMIN_TOKEN_FILE's default, which
// the admin CLI reads too.
const DefaultAdminTokenFile = "./data/admin-token"

// Prefix is the environment variable prefix.
const Prefix = "DELAYBRIDGE"

// schemaName keeps DELAYBRIDGE_POSTGRES_SCHEMA a plain identifier, so it
// never needs quoting and cannot differ from itself by case.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Load reads and validates the environment. The error names the variable.
func Load() (Config, error) {
	var c Config
	// Full names in the tags and no prefix: envconfig would otherwise fall
	// back to the bare names (AMQP_URL, ENDPOINT, ...), so a stray variable
	// in a shared environment could silently rename queues or the store.
	if err := envconfig.Process("", &c); err != nil {
		return Config{}, explain(err)
	}
	return c, c.Validate()
}

// explain turns envconfig's parse error into one line naming the variable.
func explain(err error) error {
	if pe, ok := err.(*envconfig.ParseError); ok {
		return fmt.Errorf("%s: invalid value %q: expected %s", pe.KeyName, pe.Value, pe.TypeName)
	}
	return err
}

// Validate checks values envconfig cannot: ranges, enums and URLs. It
// returns the first problem, checking in this order.
func (c Config) Validate() error {
	for _, check := range []func() error{
		c.checkBroker, c.checkQueues, c.checkStore, c.checkHTTPAddr, c.checkLimits,
		c.checkDestinations, c.checkManagement, c.checkRebus, c.checkMassTransit, c.checkChoices,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// bad is the error for variable DELAYBRIDGE_name.
func bad(name, format string, a ...any) error {
	return fmt.Errorf("%s_%s: %s", Prefix, name, fmt.Sprintf(format, a...))
}

// checkBroker checks DELAYBRIDGE_AMQP_URL, the failover URLs and the TLS
// files.
func (c Config) checkBroker() error {
	u, err := url.Parse(c.AMQPURL)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		// Never echo the URL: it may carry the password.
		return bad("AMQP_URL", "must be an amqp:// or amqps:// URL with a host")
	}
	for i, raw := range c.AMQPFailoverURLs {
		f, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || (f.Scheme != "amqp" && f.Scheme != "amqps") || f.Host == "" {
			return bad("AMQP_FAILOVER_URLS", "entry %d must be an amqp:// or amqps:// URL with a host", i+1)
		}
		// One TLS setting serves every broker, so the schemes must agree.
		if f.Scheme != u.Scheme {
			return bad("AMQP_FAILOVER_URLS", "entry %d is %s:// but DELAYBRIDGE_AMQP_URL is %s://; use one scheme for all brokers", i+1, f.Scheme, u.Scheme)
		}
	}
	if tf := c.TLSFiles(); !tf.IsZero() {
		if u.Scheme != "amqps" {
			return bad("AMQP_URL", "must be an amqps:// URL when DELAYBRIDGE_TLS_* variables are set")
		}
		if err := tf.Validate(); err != nil {
			name := "TLS_CA_FILE"
			var fe *broker.TLSFileError
			if errors.As(err, &fe) {
				name = map[string]string{"CAFile": "TLS_CA_FILE", "CertFile": "TLS_CERT_FILE", "KeyFile": "TLS_KEY_FILE"}[fe.Field]
			}
			return bad(name, "%v", err)
		}
	}
	return nil
}

// checkQueues checks DELAYBRIDGE_ENDPOINT and DELAYBRIDGE_ERROR_QUEUE: names
// the broker takes, and an error queue that is none of the bridge's inputs.
func (c Config) checkQueues() error {
	if c.Endpoint == "" || len(c.Endpoint) > 200 {
		return bad("ENDPOINT", "must be 1 to 200 characters")
	}
	if c.ErrorQueue == "" || len(c.ErrorQueue) > 255 {
		return bad("ERROR_QUEUE", "must be 1 to 255 characters")
	}
	// Queue names the broker would refuse at declaration, with exit 1 and a
	// broker error, are a configuration mistake: say so here.
	for name, q := range map[string]string{"ENDPOINT": wire.DispatcherQueue(c.Endpoint), "ERROR_QUEUE": c.ErrorQueue} {
		if err := wire.ValidateDestination("the queue name", q); err != nil {
			return bad(name, "%v", err)
		}
	}
	// An error copy published to the bridge's own input would be taken in,
	// refused and copied again, without end.
	for _, own := range []string{wire.TimeoutsQueue(c.Endpoint), wire.DispatcherQueue(c.Endpoint)} {
		if c.ErrorQueue == own {
			return bad("ERROR_QUEUE", "%q is one of the bridge's own queues (DELAYBRIDGE_ENDPOINT %q); use a queue of its own", c.ErrorQueue, c.Endpoint)
		}
	}
	if c.NSBNativeDelays && (isLevel(nsbdelay.V2, c.ErrorQueue) || isLevel(nsbdelay.V1, c.ErrorQueue)) {
		return bad("ERROR_QUEUE", "%q is a delay-level queue of the NServiceBus transport, which DELAYBRIDGE_NSB_NATIVE_DELAYS consumes; use a queue of its own", c.ErrorQueue)
	}
	return nil
}

// checkStore checks DELAYBRIDGE_STORE and the settings of the store it
// names.
func (c Config) checkStore() error {
	switch c.Store {
	case "bbolt":
		if c.StorePath == "" {
			return bad("STORE_PATH", "must not be empty with DELAYBRIDGE_STORE=bbolt")
		}
	case "postgres":
		if c.PostgresURL == "" {
			return bad("POSTGRES_URL", "must be set with DELAYBRIDGE_STORE=postgres (for example postgres://user:pass@host:5432/db)")
		}
		// A URL or a key=value connection string (host=db user=app ...);
		// pgx checks the rest when it connects. Never echo the value: it
		// may carry the password.
		if strings.Contains(c.PostgresURL, "://") {
			p, err := url.Parse(c.PostgresURL)
			if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
				return bad("POSTGRES_URL", "must be a postgres:// or postgresql:// URL, or a key=value connection string")
			}
		} else if !strings.Contains(c.PostgresURL, "=") {
			return bad("POSTGRES_URL", "must be a postgres:// or postgresql:// URL, or a key=value connection string")
		}
		if !schemaName.MatchString(c.PostgresSchema) {
			return bad("POSTGRES_SCHEMA", "%q must be 1 to 63 lower-case letters, digits or _, starting with a letter or _", c.PostgresSchema)
		}
	default:
		return bad("STORE", "%q is not one of bbolt, postgres", c.Store)
	}
	return nil
}

// checkHTTPAddr checks DELAYBRIDGE_HTTP_ADDR.
func (c Config) checkHTTPAddr() error {
	if err := httpAddr(c.HTTPAddr); err != nil {
		return bad("HTTP_ADDR", "%v", err)
	}
	return nil
}

// checkLimits checks the intervals, sizes, retries and breaker times.
func (c Config) checkLimits() error {
	if c.PollInterval <= 0 {
		return bad("POLL_INTERVAL", "must be positive, got %s", c.PollInterval)
	}
	if c.MisfireThreshold < time.Second {
		return bad("MISFIRE_THRESHOLD", "must be at least 1s, got %s", c.MisfireThreshold)
	}
	if c.MetricsMaxDestinations < 1 || c.MetricsMaxDestinations > 10000 {
		return bad("METRICS_MAX_DESTINATIONS", "must be 1 to 10000, got %d", c.MetricsMaxDestinations)
	}
	if c.MetricsDestinationInterval < time.Second {
		return bad("METRICS_DESTINATION_INTERVAL", "must be at least 1s, got %s", c.MetricsDestinationInterval)
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		return bad("BATCH_SIZE", "must be 1 to 100000, got %d", c.BatchSize)
	}
	if c.LockLeaseDuration < time.Second {
		return bad("LOCK_LEASE_DURATION", "must be at least 1s, got %s", c.LockLeaseDuration)
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		return bad("PREFETCH", "must be 1 to 65535, got %d", c.Prefetch)
	}
	if c.NumberOfRetries < 0 {
		return bad("NUMBER_OF_RETRIES", "must not be negative, got %d", c.NumberOfRetries)
	}
	for name, d := range map[string]time.Duration{
		"TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER":    c.TimeToTriggerStoreCircuitBreaker,
		"TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER":    c.TimeToTriggerFetchCircuitBreaker,
		"TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": c.TimeToTriggerDispatchBreaker,
	} {
		if d <= 0 {
			return bad(name, "must be positive, got %s", d)
		}
	}
	if c.MaxRecoveryFailuresPerSecond < 1 {
		return bad("MAXIMUM_RECOVERY_FAILURES_PER_SECOND", "must be at least 1, got %d", c.MaxRecoveryFailuresPerSecond)
	}
	if c.MaxDelay < 0 {
		return bad("MAX_DELAY", "must not be negative, got %s", c.MaxDelay)
	}
	if c.MaxMessageBytes < 1 {
		return bad("MAX_MESSAGE_BYTES", "must be positive, got %d", c.MaxMessageBytes)
	}
	if c.MaxInflightBytes < 0 {
		return bad("MAX_INFLIGHT_BYTES", "must not be negative (0: no byte limit), got %d", c.MaxInflightBytes)
	}
	return nil
}

// checkDestinations checks DELAYBRIDGE_ALLOWED_DESTINATIONS and
// DELAYBRIDGE_DELAYED_EXCHANGES.
func (c Config) checkDestinations() error {
	if len(c.AllowedDestinations) == 0 {
		return bad("ALLOWED_DESTINATIONS", "must name at least one pattern (use * for any)")
	}
	for _, p := range c.AllowedDestinations {
		if strings.TrimSpace(p) == "" {
			return bad("ALLOWED_DESTINATIONS", "has an empty pattern")
		}
	}
	if _, err := c.delayedExchanges(); err != nil {
		return bad("DELAYED_EXCHANGES", "%v", err)
	}
	return nil
}

// checkManagement checks DELAYBRIDGE_MANAGEMENT_URL and
// DELAYBRIDGE_BINDING_CHECK_INTERVAL.
func (c Config) checkManagement() error {
	if c.ManagementURL != "" {
		m, err := url.Parse(c.ManagementURL)
		if err != nil || (m.Scheme != "http" && m.Scheme != "https") || m.Host == "" {
			// Never echo the URL: it may carry the password.
			return bad("MANAGEMENT_URL", "must be an http:// or https:// URL with a host (the RabbitMQ management API, e.g. http://rabbit:15672/)")
		}
	}
	if c.BindingCheckInterval < time.Second {
		return bad("BINDING_CHECK_INTERVAL", "must be at least 1s, got %s", c.BindingCheckInterval)
	}
	return nil
}

// checkChoices checks the variables that name one of a few values:
// DELAYBRIDGE_QUEUE_TYPE, DELAYBRIDGE_LOG_LEVEL and DELAYBRIDGE_LOG_FORMAT.
func (c Config) checkChoices() error {
	switch c.QueueType {
	case "classic", "quorum":
	default:
		return bad("QUEUE_TYPE", "%q is not one of classic, quorum", c.QueueType)
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		return bad("LOG_LEVEL", "%q is not a zerolog level (trace, debug, info, warn, error, fatal, panic, disabled)", c.LogLevel)
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		return bad("LOG_FORMAT", "%q is not one of json, console", c.LogFormat)
	}
	return nil
}

// DelayedExchangeList returns DELAYBRIDGE_DELAYED_EXCHANGES, which Validate
// has checked.
func (c Config) DelayedExchangeList() []delayed.Exchange {
	xs, _ := c.delayedExchanges()
	return xs
}

// delayedExchanges parses DELAYBRIDGE_DELAYED_EXCHANGES (name:type,...) and
// refuses what the broker would refuse at declaration, and names that would
// make two of the bridge's exchanges one, or read as one of its queues.
func (c Config) delayedExchanges() ([]delayed.Exchange, error) {
	var xs []delayed.Exchange
	// Every exchange declared so far (names and routing exchanges), and the
	// bridge's own queues: one name must not mean two things.
	taken := map[string]string{}
	for _, q := range []string{wire.TimeoutsQueue(c.Endpoint), wire.DispatcherQueue(c.Endpoint), c.ErrorQueue} {
		taken[q] = "one of the bridge's own queues"
	}
	for i, raw := range c.DelayedExchanges {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			return nil, fmt.Errorf("entry %d is empty", i+1)
		}
		// Exchange names may hold ':'; types never do.
		cut := strings.LastIndexByte(entry, ':')
		if cut < 0 {
			return nil, fmt.Errorf("entry %d %q must be name:type, type one of %s", i+1, entry, strings.Join(delayed.Types, ", "))
		}
		x := delayed.Exchange{Name: strings.TrimSpace(entry[:cut]), Type: strings.TrimSpace(entry[cut+1:])}
		if !slices.Contains(delayed.Types, x.Type) {
			hint := ""
			if x.Type == "x-delayed-message" {
				hint = " (give the plugin's x-delayed-type: the bridge replaces x-delayed-message)"
			}
			return nil, fmt.Errorf("entry %d %q: type %q is not one of %s%s", i+1, entry, x.Type, strings.Join(delayed.Types, ", "), hint)
		}
		if x.Name == "" {
			return nil, fmt.Errorf("entry %d %q has no exchange name", i+1, entry)
		}
		if err := wire.ValidateExchange("the exchange name", x.Name); err != nil {
			return nil, fmt.Errorf("entry %d %q: %w", i+1, entry, err)
		}
		if err := wire.ValidateExchange("its routing exchange's name "+x.Route(), x.Route()); err != nil {
			return nil, fmt.Errorf("entry %d %q: %w", i+1, entry, err)
		}
		// The broker refuses to declare these names (access-refused).
		if strings.HasPrefix(x.Name, "amq.") {
			return nil, fmt.Errorf("entry %d %q: names starting with amq. are reserved by the broker", i+1, entry)
		}
		for _, name := range []string{x.Name, x.Route()} {
			if what, ok := taken[name]; ok {
				return nil, fmt.Errorf("entry %d %q: %q is %s; use another name", i+1, entry, name, what)
			}
		}
		taken[x.Name] = "a delayed exchange named before"
		taken[x.Route()] = fmt.Sprintf("the routing exchange of %q, named before", x.Name)
		xs = append(xs, x)
	}
	return xs, nil
}

// checkRebus checks DELAYBRIDGE_REBUS_QUEUE and DELAYBRIDGE_REBUS_DIRECT_EXCHANGE:
// names the broker takes, and none that is already the bridge's.
func (c Config) checkRebus() error {
	if c.RebusQueue == "" {
		return nil
	}
	if err := wire.ValidateDestination("the queue name", c.RebusQueue); err != nil {
		return fmt.Errorf("%s_REBUS_QUEUE: %w", Prefix, err)
	}
	for _, own := range []string{wire.TimeoutsQueue(c.Endpoint), wire.DispatcherQueue(c.Endpoint), c.ErrorQueue} {
		if c.RebusQueue == own {
			return fmt.Errorf("%s_REBUS_QUEUE: %q is one of the bridge's own queues; use the timeout manager address of the Rebus endpoints", Prefix, own)
		}
	}
	if c.RebusDirectExchange == "" || c.RebusDirectExchange == "amq.default" {
		return fmt.Errorf("%s_REBUS_DIRECT_EXCHANGE: must name the endpoints' direct exchange (Rebus's default is RebusDirect)", Prefix)
	}
	if err := wire.ValidateExchange("the exchange name", c.RebusDirectExchange); err != nil {
		return fmt.Errorf("%s_REBUS_DIRECT_EXCHANGE: %w", Prefix, err)
	}
	// The bridge's queues and the Rebus queue each have a fanout exchange
	// of their name (docs/contract.md §1).
	for _, own := range []string{wire.TimeoutsQueue(c.Endpoint), wire.DispatcherQueue(c.Endpoint), c.ErrorQueue, c.RebusQueue} {
		if c.RebusDirectExchange == own {
			return fmt.Errorf("%s_REBUS_DIRECT_EXCHANGE: %q is the name of a queue the bridge declares an exchange for; use the endpoints' direct exchange", Prefix, own)
		}
	}
	for _, x := range c.DelayedExchangeList() {
		for _, name := range []string{c.RebusDirectExchange, c.RebusQueue} {
			if name == x.Name || name == x.Route() {
				return fmt.Errorf("%s_REBUS_%s: %q is an exchange of %s_DELAYED_EXCHANGES", Prefix,
					map[bool]string{true: "QUEUE", false: "DIRECT_EXCHANGE"}[name == c.RebusQueue], name, Prefix)
			}
		}
	}
	if _, err := c.rebusDirectExchangeArgs(); err != nil {
		return fmt.Errorf("%s_REBUS_DIRECT_EXCHANGE_ARGUMENTS: %w", Prefix, err)
	}
	return nil
}

// RebusDirectExchangeArguments returns DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS,
// which Validate has checked: the arguments the Rebus endpoints declare
// their direct exchange with, string values as AddArgumentToDirectExchange
// takes them; nil when none.
func (c Config) RebusDirectExchangeArguments() amqp.Table {
	args, _ := c.rebusDirectExchangeArgs()
	return args
}

// rebusDirectExchangeArgs parses key=value entries: a key once, not empty.
func (c Config) rebusDirectExchangeArgs() (amqp.Table, error) {
	var args amqp.Table
	for i, raw := range c.RebusDirectExchangeArgs {
		key, value, ok := strings.Cut(raw, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" {
			return nil, fmt.Errorf("entry %d must be key=value, as an endpoint's AddArgumentToDirectExchange(key, value)", i+1)
		}
		if _, dup := args[key]; dup {
			return nil, fmt.Errorf("entry %d repeats the argument %q", i+1, key)
		}
		if !utf8.ValidString(raw) {
			return nil, fmt.Errorf("entry %d is not valid UTF-8", i+1)
		}
		if args == nil {
			args = amqp.Table{}
		}
		args[key] = value
	}
	return args, nil
}

// checkMassTransit checks DELAYBRIDGE_MASSTRANSIT_QUEUE: a queue name the broker
// takes, none of the bridge's own queues nor the Rebus intake, and no
// exchange the bridge owns (the queue is bound to an exchange of its name).
func (c Config) checkMassTransit() error {
	q := c.MassTransitQueue
	if q == "" {
		return nil
	}
	if err := wire.ValidateDestination("the queue name", q); err != nil {
		return fmt.Errorf("%s_MASSTRANSIT_QUEUE: %w", Prefix, err)
	}
	owns := []string{wire.TimeoutsQueue(c.Endpoint), wire.DispatcherQueue(c.Endpoint), c.ErrorQueue}
	if c.RebusQueue != "" {
		owns = append(owns, c.RebusQueue, c.RebusDirectExchange)
	}
	for _, own := range owns {
		if q == own {
			return fmt.Errorf("%s_MASSTRANSIT_QUEUE: %q is already the bridge's; use the scheduler address of the MassTransit endpoints", Prefix, own)
		}
	}
	for _, x := range c.DelayedExchangeList() {
		if q == x.Name || q == x.Route() {
			return fmt.Errorf("%s_MASSTRANSIT_QUEUE: %q is an exchange of %s_DELAYED_EXCHANGES", Prefix, q, Prefix)
		}
	}
	return nil
}

// httpAddr checks a listen address: empty (HTTP off) or host:port.
func httpAddr(a string) error {
	if a == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil || port == "" {
		if _, nerr := strconv.Atoi(a); nerr == nil {
			return fmt.Errorf("%q is not host:port; for port %s on every interface write \":%s\"", a, a, a)
		}
		return fmt.Errorf("%q is not host:port (e.g. :8080 or 127.0.0.1:8080; empty turns HTTP off)", a)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", a, port)
	}
	return nil
}

func isLevel(c nsbdelay.Chain, q string) bool { _, ok := c.LevelOf(q); return ok }
