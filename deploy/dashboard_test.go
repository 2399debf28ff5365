package deploy

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

const (
	dashboardFile = "grafana/delaybridge.json"
	rulesFile     = "prometheus/rules.yml"
)

// metricName finds the bridge's series names in a PromQL expression.
var metricName = regexp.MustCompile(`\bdelaybridge[_:][a-zA-Z0-9_:]*`)

// exported returns every series name the bridge's /metrics serves (with
// every collector fed, so that the scrape-time ones appear) and every
// recording rule of rules.yml, each with the labels its series carry (nil
// for a recording rule, whose labels its expression decides).
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	m := metrics.New()
	m.WatchStore(func(context.Context) (int, int, error) { return 1, 0, nil },
		func(context.Context) (time.Time, bool, error) { return time.Now(), true, nil }, time.Now)
	m.WatchConnection("publish", func() bool { return true })
	m.WatchBlocked("publish", func() bool { return false })
	m.WatchErrorQueue(func() bool { return false })
	m.WatchDestinations(metrics.DestinationOptions{
		Count: func(context.Context, time.Time, time.Time) (map[wire.Destination]storage.DestinationCount, error) {
			return map[wire.Destination]storage.DestinationCount{wire.Queue("q"): {Pending: 1}}, nil
		},
		Paused: func(context.Context) ([]storage.PausedDestination, error) { return nil, nil },
	})
	m.DestinationDispatched(wire.Queue("q"), 1)
	m.DestinationDispatchFailed(wire.Queue("q"))
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]map[string]bool{}
	for _, f := range fams {
		labels := map[string]bool{}
		for _, mm := range f.GetMetric() {
			for _, lp := range mm.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
		series[f.GetName()] = labels
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				series[f.GetName()+s] = labels
			}
			series[f.GetName()+"_bucket"] = withLabel(labels, "le")
		}
	}
	for _, r := range loadRules(t) {
		if r.Record != "" {
			series[r.Record] = nil
		}
	}
	return series
}

func withLabel(labels map[string]bool, l string) map[string]bool {
	c := map[string]bool{l: true}
	for k := range labels {
		c[k] = true
	}
	return c
}

// selector finds a series name and its label matchers in PromQL.
var selector = regexp.MustCompile(`\b(delaybridge[_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)

// grouping finds the labels of a by clause in PromQL.
var grouping = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)

// matcherLabel is the label name of one matcher.
var matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)

// targetLabels are the labels Prometheus itself puts on every series it
// scrapes (and Kubernetes service discovery adds): a selector may use them.
var targetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true}

// checkSeries fails t for each series expr names that the bridge does not
// export, and for each label a selector of expr matches on that the series
// does not carry (such a selector matches nothing, silently).
func checkSeries(t *testing.T, known map[string]map[string]bool, what, expr string) []string {
	t.Helper()
	var names []string
	for _, n := range metricName.FindAllString(expr, -1) {
		names = append(names, n)
		if _, ok := known[n]; !ok {
			t.Errorf("%s queries %s, which neither /metrics nor %s has: %s", what, n, rulesFile, expr)
		}
	}
	// An aggregation by a label none of expr's series carry yields one
	// series with that label empty: the panel draws a single line.
	carried, derived := map[string]bool{}, false
	for _, n := range names {
		if labels, ok := known[n]; ok && labels == nil {
			derived = true
		}
		for l := range known[n] {
			carried[l] = true
		}
	}
	for _, m := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !derived && !carried[l] && !targetLabels[l] {
				t.Errorf("%s groups by label %q, which none of its series carry: %s", what, l, expr)
			}
		}
	}
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		labels, ok := known[m[1]]
		if !ok || labels == nil {
			continue
		}
		for _, lm := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			if l := lm[1]; !labels[l] && !targetLabels[l] {
				t.Errorf("%s selects %s by label %q, which its series do not carry: %s", what, m[1], l, expr)
			}
		}
	}
	return names
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no rules", rulesFile)
	}
	return rules
}

// collect appends the PromQL of every panel target and template variable.
func collect(v any, key string, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok && (k == "expr" || (key == "query" && k == "query") || k == "definition") {
				*out = append(*out, s)
			}
			collect(c, k, out)
		}
	case []any:
		for _, c := range x {
			collect(c, key, out)
		}
	}
}

func TestDashboardQueriesExistingSeries(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	if d["uid"] != "delaybridge" {
		t.Errorf("uid %v, want delaybridge (links and the compose home dashboard use it)", d["uid"])
	}
	var exprs []string
	collect(d, "", &exprs)
	known := exported(t)
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range checkSeries(t, known, "the dashboard", e) {
			used[n] = true
		}
	}
	// The panels the dashboard exists for.
	for _, n := range []string{
		"delaybridge:lateness_seconds:p99", "delaybridge:messages_dispatched:rate1m", "delaybridge:messages_ingested:rate1m",
		"delaybridge_pending", "delaybridge_error_queue_messages_total", "delaybridge_circuit_breaker_state",
		"delaybridge_destination_pending",
	} {
		if !used[n] {
			t.Errorf("no panel queries %s", n)
		}
	}

	ids := map[float64]bool{}
	var walk func(ps []any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm := p.(map[string]any)
			id, _ := pm["id"].(float64)
			if ids[id] {
				t.Errorf("panel id %v used twice", id)
			}
			ids[id] = true
			if sub, ok := pm["panels"].([]any); ok {
				walk(sub)
			}
		}
	}
	panels, _ := d["panels"].([]any)
	walk(panels)
}

// The rules must not depend on a scrape job's name (a PodMonitor names its
// job after itself), and query only series that exist.
func TestRulesNoJobName(t *testing.T) {
	known := exported(t)
	jobMatcher := regexp.MustCompile(`\bjob\s*(=|!=|=~|!~)`)
	for _, r := range loadRules(t) {
		name := r.Record + r.Alert
		if r.Expr == "" {
			t.Errorf("rule %s has no expr", name)
		}
		if jobMatcher.MatchString(r.Expr) {
			t.Errorf("rule %s selects a job by name: %s", name, r.Expr)
		}
		checkSeries(t, known, "rule "+name, r.Expr)
		if r.Alert != "" && r.Annotations["summary"] == "" {
			t.Errorf("alert %s has no summary", r.Alert)
		}
		if sev := r.Labels["severity"]; r.Alert != "" && sev != "critical" && sev != "warning" {
			t.Errorf("alert %s has severity %q, want critical or warning (an Alertmanager route keys on it)", r.Alert, sev)
		}
	}
}

// docker-compose.yml provisions the dashboard and a data source for its Prometheus.
func TestComposeProvisionsDashboard(t *testing.T) {
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("docker-compose.yml has no grafana service")
	}
	if _, ok := c.Services["prometheus"]; !ok {
		t.Fatal("docker-compose.yml has no prometheus service")
	}
	mounts := strings.Join(g.Volumes, "\n")
	for _, want := range []string{"./deploy/" + dashboardFile + ":", "./deploy/grafana/provisioning/datasources:", "./deploy/grafana/provisioning/dashboards:"} {
		if !strings.Contains(mounts, want) {
			t.Errorf("grafana mounts no %s", want)
		}
	}
	ds, err := os.ReadFile("grafana/provisioning/datasources/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ds), "url: http://prometheus:9090") {
		t.Error("the Grafana data source does not point at the compose Prometheus")
	}
}
