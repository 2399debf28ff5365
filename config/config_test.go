package config

import (
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/protocol/delayed"
)

func TestDefaultsMatchTheContract(t *testing.T) {
	c, err := loadClean(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		AMQPURL: "amqp://guest:guest@localhost:5672/", Endpoint: "delaybridge", ErrorQueue: "error",
		Store: "bbolt", StorePath: "./data/delaybridge.db", PostgresSchema: "delaybridge", HTTPAddr: ":8080", PollInterval: time.Second,
		MisfireThreshold: time.Minute,
		BatchSize:        1000, LockLeaseDuration: 5 * time.Minute, Prefetch: 500, NumberOfRetries: 5,
		TimeToTriggerStoreCircuitBreaker: 30 * time.Second, TimeToTriggerFetchCircuitBreaker: 30 * time.Second,
		TimeToTriggerDispatchBreaker: 30 * time.Second, MaxRecoveryFailuresPerSecond: 1,
		MaxMessageBytes: 16777216, MaxInflightBytes: 64 << 20, AllowedDestinations: []string{"*"}, QueueType: "classic",
		LogLevel: "info", LogFormat: "json", RebusDirectExchange: "RebusDirect",
		MetricsMaxDestinations: 50, MetricsDestinationInterval: 15 * time.Second, BindingCheckInterval: time.Minute,
		AdminTokenFile: "./data/admin-token",
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Fatalf("defaults differ from docs/contract.md §5 (-want +got):\n%s", diff)
	}
}

// loadClean loads with only the given DELAYBRIDGE_ variables set.
func loadClean(t *testing.T, env map[string]string) (Config, error) {
	t.Helper()
	for _, name := range allNames {
		t.Setenv(name, "") // registers the restore
		if err := os.Unsetenv(name); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	return Load()
}

// allNames are the variables Config reads.
var allNames = Variables()

func TestEveryContractVariableIsRead(t *testing.T) {
	c, err := loadClean(t, map[string]string{
		"DELAYBRIDGE_AMQP_URL": "amqps://u:p@rabbit:5671/vh", "DELAYBRIDGE_ENDPOINT": "svc",
		"DELAYBRIDGE_ERROR_QUEUE": "errs", "DELAYBRIDGE_STORE_PATH": "/tmp/x.db",
		"DELAYBRIDGE_POSTGRES_URL": "postgres://x", "DELAYBRIDGE_HTTP_ADDR": "",
		"DELAYBRIDGE_POLL_INTERVAL": "250ms", "DELAYBRIDGE_BATCH_SIZE": "10",
		"DELAYBRIDGE_LOCK_LEASE_DURATION": "1m", "DELAYBRIDGE_PREFETCH": "7",
		"DELAYBRIDGE_NUMBER_OF_RETRIES": "0", "DELAYBRIDGE_TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER": "1s",
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "2s", "DELAYBRIDGE_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": "3s",
		"DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND": "4", "DELAYBRIDGE_MAX_DELAY": "48h",
		"DELAYBRIDGE_MAX_MESSAGE_BYTES": "1024", "DELAYBRIDGE_ALLOWED_DESTINATIONS": "orders.*,billing",
		"DELAYBRIDGE_MAX_INFLIGHT_BYTES": "2048",
		"DELAYBRIDGE_ADMIN_TOKEN":        "tok", "DELAYBRIDGE_ADMIN_TOKEN_FILE": "/run/tok", "DELAYBRIDGE_QUEUE_TYPE": "quorum", "DELAYBRIDGE_LOG_LEVEL": "debug",
		"DELAYBRIDGE_LOG_FORMAT": "console", "DELAYBRIDGE_DELAYED_EXCHANGES": "orders:topic",
		"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "BusDirect",
		"DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "alternate-exchange=x", "DELAYBRIDGE_MANAGEMENT_URL": "https://m:p@rabbit:15671/",
		"DELAYBRIDGE_BINDING_CHECK_INTERVAL": "5s",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.AMQPURL != "amqps://u:p@rabbit:5671/vh" || c.Endpoint != "svc" || c.ErrorQueue != "errs" ||
		c.StorePath != "/tmp/x.db" || c.PostgresURL != "postgres://x" || c.HTTPAddr != "" ||
		c.PollInterval != 250*time.Millisecond || c.BatchSize != 10 || c.LockLeaseDuration != time.Minute ||
		c.Prefetch != 7 || c.NumberOfRetries != 0 || c.TimeToTriggerStoreCircuitBreaker != time.Second ||
		c.TimeToTriggerFetchCircuitBreaker != 2*time.Second || c.TimeToTriggerDispatchBreaker != 3*time.Second ||
		c.MaxRecoveryFailuresPerSecond != 4 || c.MaxDelay != 48*time.Hour || c.MaxMessageBytes != 1024 || c.MaxInflightBytes != 2048 ||
		strings.Join(c.AllowedDestinations, "|") != "orders.*|billing" || c.AdminToken != "tok" ||
		c.QueueType != "quorum" || c.LogLevel != "debug" || c.LogFormat != "console" ||
		strings.Join(c.DelayedExchanges, "|") != "orders:topic" || c.RebusQueue != "timeouts" || c.RebusDirectExchange != "BusDirect" ||
		strings.Join(c.RebusDirectExchangeArgs, "|") != "alternate-exchange=x" || c.ManagementURL != "https://m:p@rabbit:15671/" ||
		c.BindingCheckInterval != 5*time.Second || c.AdminTokenFile != "/run/tok" {
		t.Fatalf("not every variable was read: %+v", c)
	}
}

func TestBadValuesNameTheVariable(t *testing.T) {
	for name, value := range map[string]string{
		"DELAYBRIDGE_POLL_INTERVAL":                         "banana",
		"DELAYBRIDGE_BATCH_SIZE":                            "0",
		"DELAYBRIDGE_PREFETCH":                              "many",
		"DELAYBRIDGE_LOCK_LEASE_DURATION":                   "10ms",
		"DELAYBRIDGE_NUMBER_OF_RETRIES":                     "-1",
		"DELAYBRIDGE_MAX_DELAY":                             "-1h",
		"DELAYBRIDGE_MAX_MESSAGE_BYTES":                     "0",
		"DELAYBRIDGE_MAX_INFLIGHT_BYTES":                    "-1",
		"DELAYBRIDGE_QUEUE_TYPE":                            "fancy",
		"DELAYBRIDGE_LOG_FORMAT":                            "xml",
		"DELAYBRIDGE_LOG_LEVEL":                             "loud",
		"DELAYBRIDGE_STORE":                                 "redis",
		"DELAYBRIDGE_AMQP_URL":                              "http://guest:secret@host/",
		"DELAYBRIDGE_ALLOWED_DESTINATIONS":                  "a,,b",
		"DELAYBRIDGE_ENDPOINT":                              "",
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "0s",
		"DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND":  "0",
		"DELAYBRIDGE_AMQP_FAILOVER_URLS":                    "amqp://guest:secret@b:5672/,http://guest:secret@c/",
		"DELAYBRIDGE_DELAYED_EXCHANGES":                     "orders:x-delayed-message",
		"DELAYBRIDGE_REBUS_QUEUE":                           "time\x01outs",
		"DELAYBRIDGE_METRICS_MAX_DESTINATIONS":              "0",
		"DELAYBRIDGE_METRICS_DESTINATION_INTERVAL":          "100ms",
		"DELAYBRIDGE_MANAGEMENT_URL":                        "amqp://guest:secret@host:15672/",
		"DELAYBRIDGE_BINDING_CHECK_INTERVAL":                "500ms",
		"DELAYBRIDGE_HTTP_ADDR":                             "8080",
		"DELAYBRIDGE_MISFIRE_THRESHOLD":                     "500ms",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadClean(t, map[string]string{name: value})
			if err == nil {
				t.Fatalf("%s=%q accepted", name, value)
			}
			msg := err.Error()
			if !strings.Contains(msg, name) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q must be one line naming %s", msg, name)
			}
			if strings.Contains(msg, "secret") {
				t.Fatalf("error leaks the password: %q", msg)
			}
		})
	}
}

func TestUnprefixedVariablesAreIgnored(t *testing.T) {
	t.Setenv("ENDPOINT", "hijacked")
	t.Setenv("STORE_PATH", "/tmp/elsewhere.db")
	t.Setenv("LOG_LEVEL", "nonsense")
	c, err := loadClean(t, nil)
	if err != nil {
		t.Fatalf("an unprefixed variable broke loading: %v", err)
	}
	if c.Endpoint != "delaybridge" || c.StorePath != "./data/delaybridge.db" || c.LogLevel != "info" {
		t.Fatalf("unprefixed variables were read: %+v", c)
	}
}

func TestFailoverURLs(t *testing.T) {
	c, err := loadClean(t, map[string]string{
		"DELAYBRIDGE_AMQP_URL":           "amqp://a:5672/",
		"DELAYBRIDGE_AMQP_FAILOVER_URLS": "amqp://b:5672/, amqp://c:5672/vh",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "amqp://a:5672/|amqp://b:5672/|amqp://c:5672/vh"
	if got := strings.Join(c.AMQPURLs(), "|"); got != want {
		t.Fatalf("AMQPURLs() = %q, want %q", got, want)
	}

	_, err = loadClean(t, map[string]string{
		"DELAYBRIDGE_AMQP_URL":           "amqps://guest:secret@a:5671/",
		"DELAYBRIDGE_AMQP_FAILOVER_URLS": "amqp://guest:secret@b:5672/",
	})
	if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_AMQP_FAILOVER_URLS") || !strings.Contains(err.Error(), "one scheme") {
		t.Fatalf("mixed schemes: got %v, want an error naming DELAYBRIDGE_AMQP_FAILOVER_URLS", err)
	}
	if err != nil && strings.Contains(err.Error(), "secret") {
		t.Fatalf("error leaks the password: %q", err)
	}
}

func TestPostgresStoreNeedsURL(t *testing.T) {
	_, err := loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres"})
	if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_POSTGRES_URL") {
		t.Fatalf("postgres without a URL: got %v, want an error naming DELAYBRIDGE_POSTGRES_URL", err)
	}
	_, err = loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres", "DELAYBRIDGE_POSTGRES_URL": "mysql://root:secret@db/x"})
	if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_POSTGRES_URL") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("bad postgres URL: got %v, want an error naming the variable without the password", err)
	}
	_, err = loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres", "DELAYBRIDGE_POSTGRES_URL": "postgres://db/x",
		"DELAYBRIDGE_POSTGRES_SCHEMA": "Orders; drop"})
	if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_POSTGRES_SCHEMA") {
		t.Fatalf("bad schema name: got %v, want an error naming DELAYBRIDGE_POSTGRES_SCHEMA", err)
	}
	c, err := loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres", "DELAYBRIDGE_POSTGRES_URL": "postgres://u@db:5432/x?sslmode=disable"})
	if err != nil || c.Store != "postgres" || c.PostgresSchema != "delaybridge" {
		t.Fatalf("a valid postgres configuration was refused or lost its default schema: %+v, %v", c, err)
	}
	if _, err = loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres", "DELAYBRIDGE_POSTGRES_URL": "host=db user=app password=secret dbname=x"}); err != nil {
		t.Fatalf("a key=value connection string was refused: %v", err)
	}
	if _, err = loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres", "DELAYBRIDGE_POSTGRES_URL": "db.example.com"}); err == nil {
		t.Fatal("a bare host name was accepted as a connection string")
	}
	c, err = loadClean(t, map[string]string{"DELAYBRIDGE_STORE": "postgres", "DELAYBRIDGE_POSTGRES_URL": "postgresql://db/x",
		"DELAYBRIDGE_POSTGRES_SCHEMA": "orders_timeouts"})
	if err != nil || c.PostgresSchema != "orders_timeouts" {
		t.Fatalf("DELAYBRIDGE_POSTGRES_SCHEMA not read: %+v, %v", c, err)
	}
}

// An error queue that is the bridge's own input loops: each copy is taken in,
// refused and copied again (1,645 copies of one message in 5 s). Refused at
// start, naming the variable.
func TestErrorQueueMustNotBeAnOwnQueue(t *testing.T) {
	for _, env := range []map[string]string{
		{"DELAYBRIDGE_ERROR_QUEUE": "delaybridge.Timeouts"},
		{"DELAYBRIDGE_ERROR_QUEUE": "delaybridge.TimeoutsDispatcher"},
		{"DELAYBRIDGE_ENDPOINT": "sales", "DELAYBRIDGE_ERROR_QUEUE": "sales.Timeouts"},
		{"DELAYBRIDGE_ENDPOINT": "sales", "DELAYBRIDGE_ERROR_QUEUE": "sales.TimeoutsDispatcher"},
	} {
		_, err := loadClean(t, env)
		if err == nil {
			t.Errorf("%v accepted", env)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "DELAYBRIDGE_ERROR_QUEUE") || !strings.Contains(msg, "own queues") || strings.Contains(msg, "\n") {
			t.Errorf("%v: error %q must be one line naming DELAYBRIDGE_ERROR_QUEUE and why", env, msg)
		}
	}
	// Another endpoint's input queue is a queue like any other.
	if _, err := loadClean(t, map[string]string{"DELAYBRIDGE_ENDPOINT": "sales", "DELAYBRIDGE_ERROR_QUEUE": "delaybridge.Timeouts"}); err != nil {
		t.Errorf("another endpoint's queue refused: %v", err)
	}
}

// Queue names the broker would refuse (control characters, invalid UTF-8)
// are a configuration error naming the variable, not a broker error later.
func TestQueueNamesAreValidated(t *testing.T) {
	for env, name := range map[string]string{
		"DELAYBRIDGE_ENDPOINT":    "sales\x01east",
		"DELAYBRIDGE_ERROR_QUEUE": "err\xffors",
	} {
		_, err := loadClean(t, map[string]string{env: name})
		if err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%q: err %v, want one naming %s", env, name, err, env)
		}
	}
}

func TestDelayedExchanges(t *testing.T) {
	c, err := loadClean(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": "orders:topic, billing : direct,a:b:fanout,h:headers"})
	if err != nil {
		t.Fatal(err)
	}
	want := []delayed.Exchange{{Name: "orders", Type: "topic"}, {Name: "billing", Type: "direct"},
		{Name: "a:b", Type: "fanout"}, {Name: "h", Type: "headers"}}
	if diff := cmp.Diff(want, c.DelayedExchangeList()); diff != "" {
		t.Fatalf("DelayedExchangeList (-want +got):\n%s", diff)
	}
	if c, err := loadClean(t, nil); err != nil || c.DelayedExchangeList() != nil {
		t.Fatalf("unset: %v, %v; want none", c.DelayedExchangeList(), err)
	}
	if _, err := loadClean(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": strings.Repeat("x", 249) + ":topic"}); err != nil {
		t.Fatalf("a name whose routing exchange is 255 bytes was refused: %v", err)
	}

	for value, want := range map[string]string{
		"orders:topic,":                        "entry 2 is empty",
		",orders:topic":                        "entry 1 is empty",
		"orders":                               "must be name:type",
		"orders:":                              `type "" is not one of direct, topic, fanout, headers`,
		"orders:x-delayed-message":             "x-delayed-type",
		"orders:Topic":                         "is not one of",
		":topic":                               "has no exchange name",
		"or\x01ders:topic":                     "control characters",
		"or\xffders:topic":                     "UTF-8",
		strings.Repeat("x", 250) + ":topic":    "routing exchange's name",
		"amq.orders:topic":                     "reserved",
		"orders:topic,orders:direct":           `"orders" is a delayed exchange named before`,
		"orders:topic,orders.route:direct":     `"orders.route" is the routing exchange of "orders"`,
		"orders.route:direct,orders:topic":     `"orders.route" is a delayed exchange named before`,
		"delaybridge.Timeouts:topic":           "own queues",
		"delaybridge.TimeoutsDispatcher:topic": "own queues",
		"error:topic":                          "own queues",
		"error.route:topic,x:topic":            "", // only the name and its .route count
		"delaybridge:topic":                    "", // the endpoint is no queue
	} {
		_, err := loadClean(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": value})
		if want == "" {
			if err != nil {
				t.Errorf("%.40q refused: %v", value, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%.40q accepted", value)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "DELAYBRIDGE_DELAYED_EXCHANGES") || !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("%.40q: error %q must be one line naming DELAYBRIDGE_DELAYED_EXCHANGES and %q", value, msg, want)
		}
	}
	_, err = loadClean(t, map[string]string{"DELAYBRIDGE_ERROR_QUEUE": "orders.route", "DELAYBRIDGE_DELAYED_EXCHANGES": "orders:topic"})
	if err == nil || !strings.Contains(err.Error(), "own queues") {
		t.Errorf("a routing exchange named as the error queue: got %v", err)
	}
}

// DELAYBRIDGE_REBUS_QUEUE must be a queue of its own, and
// DELAYBRIDGE_REBUS_DIRECT_EXCHANGE, checked only then, an exchange the
// bridge can bind it to that is none of its delayed exchanges.
func TestRebus(t *testing.T) {
	for _, env := range []map[string]string{
		{"DELAYBRIDGE_REBUS_QUEUE": "timeouts"},
		{"DELAYBRIDGE_REBUS_QUEUE": "timeouts@x", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "amq.direct"},
		{"DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": ""}, // off: not checked
		{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "alternate-exchange=unrouted, x-note = a=b "},
	} {
		if _, err := loadClean(t, env); err != nil {
			t.Errorf("%v refused: %v", env, err)
		}
	}
	// AddArgumentToDirectExchange's strings, as given.
	c, err := loadClean(t, map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts",
		"DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "alternate-exchange=unrouted, x-note = a=b "})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.RebusDirectExchangeArguments(), (amqp.Table{"alternate-exchange": "unrouted", "x-note": "a=b"}); !maps.Equal(got, want) {
		t.Errorf("arguments %v, want %v", got, want)
	}
	if c, _ := loadClean(t, map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts"}); c.RebusDirectExchangeArguments() != nil {
		t.Errorf("arguments %v by default, want none", c.RebusDirectExchangeArguments())
	}
	for _, tc := range []struct {
		env       map[string]string
		name, why string
	}{
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "delaybridge.Timeouts"}, "REBUS_QUEUE", "own queues"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "delaybridge.TimeoutsDispatcher"}, "REBUS_QUEUE", "own queues"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "errors", "DELAYBRIDGE_ERROR_QUEUE": "errors"}, "REBUS_QUEUE", "own queues"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": strings.Repeat("t", 256)}, "REBUS_QUEUE", "at most 255"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": ""}, "REBUS_DIRECT_EXCHANGE", "RebusDirect"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "amq.default"}, "REBUS_DIRECT_EXCHANGE", "RebusDirect"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "Bus\xffDirect"}, "REBUS_DIRECT_EXCHANGE", "UTF-8"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_DELAYED_EXCHANGES": "RebusDirect:direct"}, "REBUS_DIRECT_EXCHANGE", "DELAYBRIDGE_DELAYED_EXCHANGES"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_DELAYED_EXCHANGES": "Rebus:direct", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "Rebus.route"}, "REBUS_DIRECT_EXCHANGE", "DELAYBRIDGE_DELAYED_EXCHANGES"},
		// The queue has a fanout exchange of its name (docs/contract.md §1).
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_DELAYED_EXCHANGES": "timeouts:direct"}, "REBUS_QUEUE", "DELAYBRIDGE_DELAYED_EXCHANGES"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "timeouts"}, "REBUS_DIRECT_EXCHANGE", "declares an exchange for"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": "delaybridge.Timeouts"}, "REBUS_DIRECT_EXCHANGE", "declares an exchange for"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "alternate-exchange"}, "REBUS_DIRECT_EXCHANGE_ARGUMENTS", "key=value"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "=x"}, "REBUS_DIRECT_EXCHANGE_ARGUMENTS", "key=value"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "a=1,a=2"}, "REBUS_DIRECT_EXCHANGE_ARGUMENTS", "repeats"},
		{map[string]string{"DELAYBRIDGE_REBUS_QUEUE": "timeouts", "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE_ARGUMENTS": "a=\xff"}, "REBUS_DIRECT_EXCHANGE_ARGUMENTS", "UTF-8"},
	} {
		_, err := loadClean(t, tc.env)
		if err == nil {
			t.Errorf("%v accepted", tc.env)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "DELAYBRIDGE_"+tc.name+":") || !strings.Contains(msg, tc.why) || strings.Contains(msg, "\n") {
			t.Errorf("%v: error %q must be one line naming DELAYBRIDGE_%s and %q", tc.env, msg, tc.name, tc.why)
		}
	}
}

// DELAYBRIDGE_MASSTRANSIT_QUEUE must be a queue of its own, whose exchange
// is none the bridge uses otherwise.
func TestMassTransit(t *testing.T) {
	for _, env := range []map[string]string{
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE": "quartz"},
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE": "RebusDirect"}, // Rebus off
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE": "quartz", "DELAYBRIDGE_REBUS_QUEUE": "timeouts"},
	} {
		c, err := loadClean(t, env)
		if err != nil {
			t.Errorf("%v refused: %v", env, err)
		} else if c.MassTransitQueue != env["DELAYBRIDGE_MASSTRANSIT_QUEUE"] {
			t.Errorf("%v: queue %q", env, c.MassTransitQueue)
		}
	}
	for env, why := range map[[2]string]string{
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE", "delaybridge.Timeouts"}:   "already the bridge's",
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE", "error"}:                  "already the bridge's",
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE", "timeouts"}:               "already the bridge's",
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE", "RebusDirect"}:            "already the bridge's",
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE", "orders"}:                 "DELAYBRIDGE_DELAYED_EXCHANGES",
		{"DELAYBRIDGE_MASSTRANSIT_QUEUE", strings.Repeat("q", 256)}: "at most 255",
	} {
		m := map[string]string{env[0]: env[1], "DELAYBRIDGE_DELAYED_EXCHANGES": "orders:direct", "DELAYBRIDGE_ERROR_QUEUE": "error"}
		if env[1] != strings.Repeat("q", 256) && env[1] != "error" && env[1] != "delaybridge.Timeouts" {
			m["DELAYBRIDGE_REBUS_QUEUE"] = "timeouts"
		}
		_, err := loadClean(t, m)
		if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_MASSTRANSIT_QUEUE:") || !strings.Contains(err.Error(), why) {
			t.Errorf("%v: error %v, want one naming DELAYBRIDGE_MASSTRANSIT_QUEUE and %q", m, err, why)
		}
	}
}

func TestMetricsDestinationVariables(t *testing.T) {
	c, err := loadClean(t, nil)
	if err != nil || c.MetricsMaxDestinations != 50 || c.MetricsDestinationInterval != 15*time.Second {
		t.Fatalf("defaults: %d, %s, %v", c.MetricsMaxDestinations, c.MetricsDestinationInterval, err)
	}
	c, err = loadClean(t, map[string]string{"DELAYBRIDGE_METRICS_MAX_DESTINATIONS": "7", "DELAYBRIDGE_METRICS_DESTINATION_INTERVAL": "2m"})
	if err != nil || c.MetricsMaxDestinations != 7 || c.MetricsDestinationInterval != 2*time.Minute {
		t.Fatalf("set: %d, %s, %v", c.MetricsMaxDestinations, c.MetricsDestinationInterval, err)
	}
}
