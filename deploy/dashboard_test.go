package deploy

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/delaybridge/delaybridge/metrics"
)

const (
	dashboardFile = "grafana/delaybridge.json"
	rulesFile     = "prometheus/rules.yml"
)

// metricName finds the bridge's series names in a PromQL expression.
var metricName = regexp.MustCompile(`\bdelaybridge[_:][a-zA-Z0-9_:]*`)

// exported returns every series name the bridge's /metrics serves (with
// every collector fed, so that the scrape-time ones appear) and every
// recording rule of rules.yml.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.WatchStore(func(context.Context) (int, int, error) { return 1, 0, nil },
		func(context.Context) (time.Time, bool, error) { return time.Now(), true, nil }, time.Now)
	m.WatchConnection("publish", func() bool { return true })
	m.WatchBlocked("publish", func() bool { return false })
	m.WatchErrorQueue(func() bool { return false })
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	for _, r := range loadRules(t) {
		if r.Record != "" {
			names[r.Record] = true
		}
	}
	return names
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
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
		for _, n := range metricName.FindAllString(e, -1) {
			used[n] = true
			if !known[n] {
				t.Errorf("the dashboard queries %s, which neither /metrics nor %s has: %s", n, rulesFile, e)
			}
		}
	}
	// The panels the dashboard exists for.
	for _, n := range []string{
		"delaybridge:lateness_seconds:p99", "delaybridge:messages_dispatched:rate1m", "delaybridge:messages_ingested:rate1m",
		"delaybridge_pending", "delaybridge_error_queue_messages_total", "delaybridge_circuit_breaker_state",
	} {
		if !used[n] {
			t.Errorf("no panel queries %s", n)
		}
	}
	if !slices.ContainsFunc(exprs, func(e string) bool {
		return strings.Contains(e, "delaybridge_pending{") && strings.Contains(e, "destination")
	}) {
		t.Error("no per-destination panel (delaybridge_pending{destination})")
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
		for _, n := range metricName.FindAllString(r.Expr, -1) {
			if !known[n] {
				t.Errorf("rule %s uses %s, which /metrics does not serve", name, n)
			}
		}
		if r.Alert != "" && r.Annotations["summary"] == "" {
			t.Errorf("alert %s has no summary", r.Alert)
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
