// Package deploy holds no code: its tests check the deployment files next to
// them (the Helm chart, the Grafana dashboard, the Prometheus rules) against
// the bridge they deploy.
package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/delaybridge/delaybridge/bridge"
	"github.com/delaybridge/delaybridge/httpapi"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

const chartDir = "helm/delaybridge"

// EnvHelm names the helm binary; scripts/test.sh sets it after installing
// helm (go install helm.sh/helm/v3/cmd/helm@...). Otherwise helm on PATH.
const EnvHelm = "DELAYBRIDGE_TEST_HELM"

func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvHelm); p != "" {
		return p
	}
	p, err := exec.LookPath("helm")
	if err != nil {
		testenv.Unavailable(t, "helm not found (set %s or put helm on PATH; scripts/test.sh installs it)", EnvHelm)
	}
	return p
}

// obj is one decoded manifest.
type obj = map[string]any

// helmTemplate renders the chart with args (-f, --set) and returns the
// manifests, or helm's error output.
func helmTemplate(t *testing.T, args ...string) ([]obj, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), append([]string{"template", "rel", chartDir, "--namespace", "ns"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, errors.New(strings.TrimSpace(stderr.String()))
	}
	var docs []obj
	dec := yaml.NewDecoder(&stdout)
	for {
		var d obj
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			t.Fatalf("helm template output is not YAML: %v", err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

func mustTemplate(t *testing.T, args ...string) []obj {
	t.Helper()
	docs, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	return docs
}

// get walks a path of map keys and list indexes ("spec.template.spec.containers.0").
func get(t *testing.T, o any, p string) any {
	t.Helper()
	cur := o
	for _, k := range strings.Split(p, ".") {
		switch c := cur.(type) {
		case obj:
			cur = c[k]
		case []any:
			var i int
			for _, r := range k {
				i = i*10 + int(r-'0')
			}
			if i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	return cur
}

func kinds(docs []obj, kind string) []obj {
	var out []obj
	for _, d := range docs {
		if d["kind"] == kind {
			out = append(out, d)
		}
	}
	return out
}

func one(t *testing.T, docs []obj, kind string) obj {
	t.Helper()
	k := kinds(docs, kind)
	if len(k) != 1 {
		t.Fatalf("%d %s manifests, want 1", len(k), kind)
	}
	return k[0]
}

// env returns the container's env entries by name.
func env(t *testing.T, container any) map[string]obj {
	t.Helper()
	out := map[string]obj{}
	list, _ := get(t, container, "env").([]any)
	for _, e := range list {
		m := e.(obj)
		out[m["name"].(string)] = m
	}
	return out
}

// checkCommon checks what both modes must have: probes on the real HTTP
// surface, a grace period covering the bridge's shutdown, a locked-down
// container, the AMQP URL from a Secret, the Service and the PodMonitor.
func checkCommon(t *testing.T, docs []obj) (deploy obj, container any) {
	t.Helper()
	deploy = one(t, docs, "Deployment")
	spec := get(t, deploy, "spec.template.spec")
	container = get(t, spec, "containers.0")
	e := env(t, container)

	port := get(t, container, "ports.0")
	if get(t, port, "name") != "http" {
		t.Errorf("container port %v is not named http", port)
	}
	if addr, want := e["DELAYBRIDGE_HTTP_ADDR"]["value"], ":"+yamlString(get(t, port, "containerPort")); addr != want {
		t.Errorf("DELAYBRIDGE_HTTP_ADDR %v, want %v (the container port)", addr, want)
	}
	for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"} {
		if p := get(t, container, probe+".httpGet.path"); p != want {
			t.Errorf("%s path %v, want %s", probe, p, want)
		}
		if p := get(t, container, probe+".httpGet.port"); p != "http" {
			t.Errorf("%s port %v, want http", probe, p)
		}
	}

	grace, _ := get(t, spec, "terminationGracePeriodSeconds").(int)
	if min := bridge.ShutdownDrain + httpapi.ShutdownTimeout; time.Duration(grace)*time.Second < min {
		t.Errorf("terminationGracePeriodSeconds %d < the bridge's shutdown drain + HTTP shutdown %s", grace, min)
	}

	if get(t, spec, "securityContext.runAsNonRoot") != true {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	if get(t, container, "securityContext.readOnlyRootFilesystem") != true {
		t.Error("container securityContext.readOnlyRootFilesystem is not true")
	}
	if get(t, container, "securityContext.allowPrivilegeEscalation") != false {
		t.Error("container securityContext.allowPrivilegeEscalation is not false")
	}
	if get(t, container, "resources.requests") == nil {
		t.Error("no resource requests")
	}
	if ref := get(t, e["DELAYBRIDGE_AMQP_URL"], "valueFrom.secretKeyRef.name"); ref == nil {
		t.Errorf("DELAYBRIDGE_AMQP_URL not from a Secret: %v", e["DELAYBRIDGE_AMQP_URL"])
	}
	if len(kinds(docs, "Secret")) != 0 {
		t.Error("the chart created a Secret although existing Secrets were named")
	}

	svc := one(t, docs, "Service")
	if get(t, svc, "spec.ports.0.targetPort") != "http" {
		t.Errorf("Service targets %v, want the http port", get(t, svc, "spec.ports.0.targetPort"))
	}
	pm := one(t, docs, "PodMonitor")
	if get(t, pm, "apiVersion") != "monitoring.coreos.com/v1" || get(t, pm, "spec.podMetricsEndpoints.0.path") != "/metrics" ||
		get(t, pm, "spec.podMetricsEndpoints.0.port") != "http" {
		t.Errorf("PodMonitor %v does not scrape http /metrics", pm)
	}
	return deploy, container
}

func yamlString(v any) string {
	b, _ := yaml.Marshal(v)
	return strings.TrimSpace(string(b))
}

// renderMode renders the chart with ci/<store>-values.yaml and checks what
// both modes must have, the store and the update strategy.
func renderMode(t *testing.T, store, strategy string) (docs []obj, deploy obj, container any, e map[string]obj) {
	t.Helper()
	docs = mustTemplate(t, "-f", chartDir+"/ci/"+store+"-values.yaml")
	deploy, container = checkCommon(t, docs)
	if s := get(t, deploy, "spec.strategy.type"); s != strategy {
		t.Errorf("strategy %v with %s, want %s", s, store, strategy)
	}
	e = env(t, container)
	if e["DELAYBRIDGE_STORE"]["value"] != store {
		t.Errorf("DELAYBRIDGE_STORE %v, want %s", e["DELAYBRIDGE_STORE"], store)
	}
	return docs, deploy, container, e
}

func TestChartBbolt(t *testing.T) {
	docs, deploy, container, e := renderMode(t, "bbolt", "Recreate")
	if r := get(t, deploy, "spec.replicas"); r != 1 {
		t.Errorf("replicas %v with bbolt, want 1", r)
	}
	storePath, _ := e["DELAYBRIDGE_STORE_PATH"]["value"].(string)
	mount := get(t, container, "volumeMounts.0")
	if get(t, mount, "name") != "data" || get(t, mount, "mountPath") != path.Dir(storePath) {
		t.Errorf("DELAYBRIDGE_STORE_PATH %q is not on the data volume (mount %v)", storePath, mount)
	}
	if get(t, mount, "readOnly") == true {
		t.Error("the store volume is mounted read-only")
	}
	pvc := one(t, docs, "PersistentVolumeClaim")
	if claim := get(t, deploy, "spec.template.spec.volumes.0.persistentVolumeClaim.claimName"); claim != get(t, pvc, "metadata.name") {
		t.Errorf("data volume claims %v, want the chart's PVC %v", claim, get(t, pvc, "metadata.name"))
	}
	if get(t, deploy, "spec.template.spec.securityContext.fsGroup") == nil {
		t.Error("no fsGroup: the bbolt volume may not be writable by the non-root user")
	}
	if len(kinds(docs, "PodDisruptionBudget")) != 0 {
		t.Error("a PodDisruptionBudget for a single bbolt replica blocks node drains")
	}
}

func TestChartPostgres(t *testing.T) {
	docs, deploy, _, e := renderMode(t, "postgres", "RollingUpdate")
	if r, _ := get(t, deploy, "spec.replicas").(int); r < 2 {
		t.Errorf("replicas %v with postgres and replicaCount 3", r)
	}
	if ref := get(t, e["DELAYBRIDGE_POSTGRES_URL"], "valueFrom.secretKeyRef.name"); ref != "delaybridge-postgres" {
		t.Errorf("DELAYBRIDGE_POSTGRES_URL not from the existing Secret: %v", e["DELAYBRIDGE_POSTGRES_URL"])
	}
	if _, ok := e["DELAYBRIDGE_STORE_PATH"]; ok {
		t.Error("DELAYBRIDGE_STORE_PATH set with postgres")
	}
	if v := get(t, deploy, "spec.template.spec.volumes"); v != nil {
		t.Errorf("volumes %v with postgres, want none", v)
	}
	if n := len(kinds(docs, "PersistentVolumeClaim")); n != 0 {
		t.Errorf("%d PersistentVolumeClaims with postgres", n)
	}
	one(t, docs, "PodDisruptionBudget")

	// Without replicaCount, postgres still runs several.
	docs = mustTemplate(t, "--set", "store.type=postgres,store.postgres.existingSecret=pg,amqp.existingSecret=amqp")
	if r, _ := get(t, one(t, docs, "Deployment"), "spec.replicas").(int); r < 2 {
		t.Errorf("default replicas %v with postgres, want several", r)
	}
}

// The admin API has the Secret's token, or is off: no pod makes a token
// file of its own, which no one outside the pod could read and which would
// differ between replicas.
func TestChartAdminToken(t *testing.T) {
	_, _, _, e := renderMode(t, "bbolt", "Recreate") // with admin.existingSecret
	if ref := get(t, e["DELAYBRIDGE_ADMIN_TOKEN"], "valueFrom.secretKeyRef.name"); ref != "delaybridge-admin" {
		t.Errorf("DELAYBRIDGE_ADMIN_TOKEN not from the Secret: %v", e["DELAYBRIDGE_ADMIN_TOKEN"])
	}
	if f, ok := e["DELAYBRIDGE_ADMIN_TOKEN_FILE"]; ok {
		t.Errorf("DELAYBRIDGE_ADMIN_TOKEN_FILE set beside the Secret: %v", f)
	}
	_, _, _, e = renderMode(t, "postgres", "RollingUpdate") // without
	if _, ok := e["DELAYBRIDGE_ADMIN_TOKEN"]; ok {
		t.Errorf("DELAYBRIDGE_ADMIN_TOKEN set without a Secret: %v", e["DELAYBRIDGE_ADMIN_TOKEN"])
	}
	if f, ok := e["DELAYBRIDGE_ADMIN_TOKEN_FILE"]; !ok || f["value"] != "" {
		t.Errorf("DELAYBRIDGE_ADMIN_TOKEN_FILE %v, want it set empty", f)
	}
}

// A URL given in values lands in a Secret of the chart, never in the pod spec.
func TestChartSecretFromValues(t *testing.T) {
	const amqpURL, pgURL = "amqp://u:amqp-secret@rabbit:5672/", "postgres://u:pg-secret@db/app"
	docs := mustTemplate(t, "--set", "store.type=postgres,amqp.url="+amqpURL+",store.postgres.url="+pgURL)
	deploy := one(t, docs, "Deployment")
	if b, _ := yaml.Marshal(deploy); bytes.Contains(b, []byte("amqp-secret")) || bytes.Contains(b, []byte("pg-secret")) {
		t.Errorf("a password is in the Deployment:\n%s", b)
	}
	secret := one(t, docs, "Secret")
	if len(get(t, secret, "data").(obj)) != 2 {
		t.Errorf("Secret data %v, want the AMQP URL and the DSN", get(t, secret, "data"))
	}
	if get(t, deploy, "spec.template.metadata.annotations.checksum/secret") == nil {
		t.Error("no checksum/secret annotation: pods would not restart when the URL changes")
	}
}

func TestChartRefuses(t *testing.T) {
	amqp := "amqp.existingSecret=amqp"
	for _, c := range []struct{ set, want string }{
		{amqp + ",replicaCount=2", "store.type=bbolt runs exactly one replica"},
		{amqp + ",terminationGracePeriodSeconds=30", "shorter than the bridge's shutdown"},
		{"store.type=bbolt", "amqp.existingSecret is required"},
		{amqp + ",store.type=postgres", "store.postgres.existingSecret is required"},
		{amqp + ",store.type=sqlite", "store.type must be bbolt or postgres"},
		{amqp + ",env.DELAYBRIDGE_STORE=postgres", "env.DELAYBRIDGE_STORE is set by the chart"},
	} {
		_, err := helmTemplate(t, "--set", c.set)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %s: error %v, want one saying %q", c.set, err, c.want)
		}
	}
}
