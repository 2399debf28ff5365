package integration

// A real three-node RabbitMQ cluster (docs/scaling.md "A RabbitMQ cluster"):
// the bridge's queues are quorum queues, DELAYBRIDGE_AMQP_FAILOVER_URLS lists
// the nodes, and a node is taken down (stop_app, then SIGKILL of its Erlang
// VM) while 10,000 messages flow: first the node the bridge's connections
// are on, then the node that leads E.Timeouts while the connections are on
// another. A third case cuts the node the bridge's connections are on off
// from the other two for 10 s (scripts/rabbitmq-cluster.sh partition: its
// Erlang distribution links reset, its AMQP port still open) and heals it.
//
// The cluster is scripts/rabbitmq-cluster.sh's (nodes cluster1..3@localhost,
// AMQP 127.0.0.1:5681–5683), which scripts/test.sh starts for the serial
// step; DELAYBRIDGE_TEST_CLUSTER_URLS names other nodes (space-separated,
// the node names from DELAYBRIDGE_TEST_CLUSTER_NODES). Without a cluster
// the test is skipped (failed under CI=true). It kills nodes, so it is
// testenv.Disruptive, and it starts the killed node again (the script's
// start) before it ends.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// clusterNodes are the test cluster's nodes: AMQP URL and Erlang node name.
type clusterNode struct{ URL, Name string }

func clusterNodes(t *testing.T) []clusterNode {
	t.Helper()
	urls := strings.Fields(os.Getenv("DELAYBRIDGE_TEST_CLUSTER_URLS"))
	names := strings.Fields(os.Getenv("DELAYBRIDGE_TEST_CLUSTER_NODES"))
	if len(urls) == 0 {
		for i := 1; i <= 3; i++ {
			urls = append(urls, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", 5680+i))
			names = append(names, fmt.Sprintf("cluster%d@localhost", i))
		}
	}
	if len(urls) != 3 || len(names) != 3 {
		t.Fatalf("DELAYBRIDGE_TEST_CLUSTER_URLS and DELAYBRIDGE_TEST_CLUSTER_NODES must name three nodes each")
	}
	nodes := make([]clusterNode, 3)
	for i := range nodes {
		nodes[i] = clusterNode{urls[i], names[i]}
		conn, err := amqp.DialConfig(urls[i], amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			testenv.Unavailable(t, "the three-node test cluster is not reachable at %s (%v): start it with scripts/rabbitmq-cluster.sh start (scripts/test.sh does)", urls[i], err)
		}
		_ = conn.Close()
	}
	return nodes
}

// clusterScript runs scripts/rabbitmq-cluster.sh with args.
func clusterScript(args ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(root, "scripts", "rabbitmq-cluster.sh"), args...).CombinedOutput()
	return string(out), err
}

// nodeNumber is node's number for scripts/rabbitmq-cluster.sh (cluster2@… → 2).
func nodeNumber(node clusterNode) string {
	return strings.TrimSuffix(strings.TrimPrefix(node.Name, "cluster"), "@localhost")
}

// clusterHealthy says whether node sees all three nodes running and no
// partition, and what it sees otherwise.
func clusterHealthy(node clusterNode) (bool, string) {
	out, err := rabbitmqctl("-n", node.Name, "cluster_status", "--formatter", "json")
	if err != nil {
		return false, fmt.Sprintf("cluster_status: %v: %s", err, out)
	}
	var st struct {
		Running    []string                   `json:"running_nodes"`
		Partitions map[string]json.RawMessage `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return false, fmt.Sprintf("cluster_status: %v: %s", err, out)
	}
	desc := fmt.Sprintf("running %v, partitions %d", st.Running, len(st.Partitions))
	return len(st.Running) == 3 && len(st.Partitions) == 0, desc
}

// queueLeader is the node that leads quorum queue q, as node sees it.
func queueLeader(t *testing.T, node clusterNode, q string) string {
	t.Helper()
	out, err := rabbitmqctl("-n", node.Name, "list_queues", "name", "leader", "--no-table-headers")
	if err != nil {
		t.Fatalf("rabbitmqctl -n %s list_queues: %v\n%s", node.Name, err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == q {
			return f[1]
		}
	}
	t.Fatalf("no leader for %s in:\n%s", q, out)
	return ""
}

// declareQuorumQueues declares the quorum queues qs on the node at url:
// their leader is that node.
func declareQuorumQueues(t *testing.T, url string, qs ...string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
			t.Fatalf("declare quorum queue %s: %v", q, err)
		}
	}
}

// deleteClusterQueuesOnCleanup deletes qs through the node at url when the
// test ends.
func deleteClusterQueuesOnCleanup(t *testing.T, url string, qs ...string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Logf("cleanup: connect to %s: %v", url, err)
			return
		}
		defer conn.Close()
		for _, q := range qs {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Logf("cleanup: delete %s: %v", q, err)
			}
			_ = ch.Close()
		}
	})
}

// TestClusterNodeLoss: a three-node cluster, the bridge's queues quorum
// queues, DELAYBRIDGE_AMQP_FAILOVER_URLS listing every node. 10,000 messages
// due 1–8 s ahead are published over ~4 s through a node that stays up;
// 2.5 s in, a node is stopped (stop_app) and its VM killed (SIGKILL):
//   - "connections": the node the bridge's three connections are on (and
//     which leads its queues, declared through it);
//   - "leader": the node that leads E.Timeouts and E.TimeoutsDispatcher,
//     while the bridge's connections are on another node.
//
// Every message arrives, none early; each duplicate is one the loss of the
// connections explains (§3.3: a forward due before it, first delivered at
// most 1 s after it, whose confirm was lost with the connection);
// forwarding resumes within 5 s: the first message due after the bridge
// lost its connections (after stop_app began, when it lost none) arrives
// within 5 s of that, or of the cluster serving again if that came later.
// What the bridge is held to is its own part: a probe quorum queue, led by
// the node taken down as the bridge's queues are, which the test publishes
// to and consumes from through the client's node, tells when the cluster
// serves such a queue again (the first probe sent after the loss that
// arrives). Both figures are logged, with the lateness of the messages due
// in the 10 s after stop_app began and the time the node took to come back.
//
// "partition": the node the bridge's connections are on (leading its
// queues) is cut off from the other two at the same moment and healed 10 s
// later. pause_minority (scripts/rabbitmq-cluster.sh) pauses it and it
// closes its client connections; the bridge fails over. The same checks,
// with forwarding resumed within 10 s of the later of the loss and the
// probe's return, and after the heal the cluster is whole again
// within 60 s: every node running, no partition recorded.
func TestClusterNodeLoss(t *testing.T) {
	testenv.Disruptive(t)
	requireRabbitmqctl(t)
	nodes := clusterNodes(t)
	for _, tc := range []struct {
		name string
		// bridge: the order of the bridge's URLs (the first is where its
		// connections go); queues: the node its queues are declared on
		// (their leader); client: the node of the test's publisher and
		// consumer; kill: the node taken down.
		bridge               []int
		queues, client, down int
		partition            bool
	}{
		{"connections", []int{0, 1, 2}, 0, 2, 0, false},
		{"leader", []int{1, 2, 0}, 2, 0, 2, false},
		{"partition", []int{0, 1, 2}, 0, 2, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.partition {
				requireIptables(t)
			}
			runClusterNodeLoss(t, nodes, tc.bridge, tc.queues, tc.client, tc.down, tc.partition)
		})
	}
}

// requireIptables skips (fails under CI=true) when the partition cannot be
// made: no iptables, or no right to change its rules (CAP_NET_ADMIN).
func requireIptables(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		testenv.Unavailable(t, "iptables not found (%v): the partition case needs it (scripts/test.sh installs it as root)", err)
	}
	if out, err := exec.Command("iptables", "-w", "-n", "-L", "INPUT").CombinedOutput(); err != nil {
		testenv.Unavailable(t, "iptables -L INPUT: %v (%s): the partition case needs CAP_NET_ADMIN", err, strings.TrimSpace(string(out)))
	}
}

// restoredAfterConnectionLoss is restoredAfterKills for one bridge process
// that lost its connections rather than died: messages whose intake was
// committed but not acknowledged come back on E.Timeouts over the new
// connection, and one whose stored copy was already forwarded is stored and
// delivered again (docs/contract.md §3.3). Its log counts as that of a
// process started after a kill.
func restoredAfterConnectionLoss(log string) map[string]int {
	return restoredAfterKills([]string{"", log})
}

// awaitClusterWhole fails the test unless, within 60 s of healed, every node
// sees all three running and no partition: the paused node rejoins by itself
// once its peers answer again.
func awaitClusterWhole(t *testing.T, nodes []clusterNode, healed time.Time) {
	t.Helper()
	for deadline := healed.Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		ok := true
		var seen []string
		for _, nd := range nodes {
			h, desc := clusterHealthy(nd)
			ok = ok && h
			seen = append(seen, nd.Name+": "+desc)
		}
		if ok {
			t.Logf("the cluster is whole again %s after the heal", time.Since(healed).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the cluster is not whole 60 s after the heal: %s", strings.Join(seen, "; "))
			return
		}
	}
}

func runClusterNodeLoss(t *testing.T, nodes []clusterNode, order []int, queuesOn, clientOn, killIdx int, partition bool) {
	const (
		n      = 10000
		batch  = 250
		every  = 100 * time.Millisecond // 40 batches: ~4 s of publishing
		killAt = 2500 * time.Millisecond
		// A partition lasts this long, then heals.
		partitionFor = 10 * time.Second
	)
	resumeWithin := 5 * time.Second
	if partition {
		resumeWithin = 10 * time.Second
	}
	testStart := time.Now()
	victim, client := nodes[killIdx], nodes[clientOn]
	var failover []string
	for _, i := range order[1:] {
		failover = append(failover, nodes[i].URL)
	}
	endpoint := uniqueEndpoint(t)
	queues := []string{endpoint + ".Timeouts", endpoint + ".TimeoutsDispatcher", endpoint + ".error"}
	dest, probeQ := endpoint+".dst", endpoint+".probe"
	deleteClusterQueuesOnCleanup(t, client.URL, append(queues, dest, probeQ)...)
	// The node comes back whatever happens, for the next test.
	t.Cleanup(func() {
		began := time.Now()
		if out, err := clusterScript("start"); err != nil {
			t.Errorf("cleanup: scripts/rabbitmq-cluster.sh start: %v\n%s", err, out)
		} else {
			t.Logf("%s back in the cluster %s later", victim.Name, time.Since(began).Round(time.Millisecond))
		}
	})
	if partition {
		// Runs before the start above: no rule outlives the test.
		t.Cleanup(func() {
			if out, err := clusterScript("heal"); err != nil {
				t.Errorf("cleanup: scripts/rabbitmq-cluster.sh heal: %v\n%s", err, out)
			}
		})
	}
	// The probe queue is led by the node the bridge's queues are led by.
	declareQuorumQueues(t, nodes[queuesOn].URL, append(queues, probeQ)...)
	declareQuorumQueues(t, client.URL, dest)
	probe := startClusterProbe(t, client.URL, probeQ)

	b := execBridge(t, bridgeEnv(t, map[string]string{
		"DELAYBRIDGE_ENDPOINT":           endpoint,
		"DELAYBRIDGE_AMQP_URL":           nodes[order[0]].URL,
		"DELAYBRIDGE_AMQP_FAILOVER_URLS": strings.Join(failover, ","),
		"DELAYBRIDGE_QUEUE_TYPE":         "quorum",
		// "stored" and "forwarding" lines: restoredAfterConnectionLoss.
		"DELAYBRIDGE_LOG_LEVEL": "debug",
	}))
	b.waitReady(30 * time.Second)
	c := startFaultConsumerAt(t, client.URL, dest)
	pub, err := newFaultPublisherAt(client.URL, "it-cluster-publisher")
	if err != nil {
		t.Fatalf("publisher: %v", err)
	}
	t.Cleanup(pub.Close)
	mon := startReadyMonitor(t, b.HTTPAddr)
	defer func() {
		summarizeBridgeLog(t, "", b)
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	}()

	// Where things are before the kill.
	conns := connectedBrokers(t, b)
	for _, l := range conns {
		if l.Broker != broker.Redact(nodes[order[0]].URL) {
			t.Fatalf("setup: bridge connection %v, want every one on the first URL %s", l, broker.Redact(nodes[order[0]].URL))
		}
	}
	leader := queueLeader(t, client, queues[0])
	t.Logf("bridge connections: %v; %s leader: %s; killing %s; test clients on %s", conns, queues[0], leader, victim.Name, client.Name)
	if leader != victim.Name {
		t.Fatalf("setup: %s leads %s, want %s (the queues were declared through it)", leader, queues[0], victim.Name)
	}

	start := time.Now()
	pubDone := publishWaveAsync(pub, queues[0], []string{dest}, "cluster-", n, batch, every, time.Second, 8*time.Second)

	time.Sleep(time.Until(start.Add(killAt)))
	if !b.Running() {
		t.Fatalf("the bridge exited with code %d before the kill", b.exitCode)
	}
	kill := time.Now()
	if partition {
		if out, err := clusterScript("partition", nodeNumber(victim)); err != nil {
			t.Fatalf("partition %s: %v\n%s", victim.Name, err, out)
		}
		t.Logf("%s: cut off from the cluster at +%s; %d deliveries so far", victim.Name, kill.Sub(start).Round(time.Millisecond), c.Count())
		time.Sleep(time.Until(kill.Add(partitionFor)))
		if out, err := clusterScript("heal"); err != nil {
			t.Fatalf("heal: %v\n%s", err, out)
		}
		healed := time.Now()
		t.Logf("healed at +%s; %d deliveries so far", healed.Sub(start).Round(time.Millisecond), c.Count())
		awaitClusterWhole(t, nodes, healed)
	} else {
		if out, err := rabbitmqctl("-n", victim.Name, "stop_app"); err != nil {
			t.Errorf("rabbitmqctl -n %s stop_app: %v\n%s", victim.Name, err, out)
		}
		stopped := time.Now()
		if out, err := clusterScript("kill", nodeNumber(victim)); err != nil {
			t.Fatalf("kill %s: %v\n%s", victim.Name, err, out)
		}
		t.Logf("%s: stop_app at +%s took %s, then SIGKILL; %d deliveries so far", victim.Name, kill.Sub(start).Round(time.Millisecond),
			stopped.Sub(kill).Round(time.Millisecond), c.Count())
	}

	res := awaitWave(t, pubDone)
	due := res.due
	t.Logf("published and confirmed %d messages in %s", len(due), res.end.Sub(start).Round(time.Millisecond))
	got, rep := collectWave(t, c, due, 30*time.Second, 2*time.Second)

	// The node closes the bridge's connections some time into stop_app:
	// forwards up to then were published, and those whose confirms were
	// outstanding are sent again (§3.3).
	lost := kill
	for _, l := range connectionLogLines(t, b, "broker connection lost; reconnecting") {
		if l.At.After(lost) {
			lost = l.At
		}
	}
	// The cluster serves again: the first probe sent after the loss arrives.
	back, served := probe.servedAfter(lost)
	if !served {
		t.Errorf("no probe sent after the loss reached %s through %s: the cluster did not serve the queue again", probeQ, client.Name)
		back = lost
	}
	from := lost // the later of the two
	if back.After(from) {
		from = back
	}
	// Resumed: the first arrival of a message due after the connections
	// were lost (or, when they stayed up, after the stop began).
	var resumed time.Time
	var lates []time.Duration
	for id, d := range due {
		as := rep.arrivals[id]
		if len(as) == 0 || d.Before(kill) {
			continue
		}
		if !d.Before(lost) && (resumed.IsZero() || as[0].At.Before(resumed)) {
			resumed = as[0].At
		}
		if d.Before(kill.Add(10 * time.Second)) {
			lates = append(lates, as[0].At.Sub(d))
		}
	}
	if resumed.IsZero() || len(lates) == 0 {
		t.Fatalf("no message was due after the kill: the test proves nothing")
	}
	slices.Sort(lates)
	checkDuplicatesExplainedByKills(t, rep, due, []killEvent{{At: lost, Running: resumed}}, restoredAfterConnectionLoss(b.Stderr()))
	logWaveReport(t, c, due, got, rep)
	t.Logf("bridge connections lost %s after the node was taken down (stop_app or partition); the cluster served the probe queue again %s after the loss; forwarding resumed %s after the loss, %s after the later of the two; lateness of the %d messages due in the 10 s after it was taken down: median %s, p99 %s, max %s",
		lost.Sub(kill).Round(time.Millisecond), back.Sub(lost).Round(time.Millisecond), resumed.Sub(lost).Round(time.Millisecond),
		resumed.Sub(from).Round(time.Millisecond), len(lates), lates[len(lates)/2].Round(time.Millisecond),
		lates[len(lates)*99/100].Round(time.Millisecond), lates[len(lates)-1].Round(time.Millisecond))
	t.Logf("bridge connections at the end: %v; /readyz (from the start of publishing): %s", connectedBrokers(t, b), mon.String(start))
	if r := resumed.Sub(from); r > resumeWithin {
		t.Errorf("forwarding resumed %s after the bridge lost the node and the cluster served again, want within %s", r.Round(time.Millisecond), resumeWithin)
	}
	checkReadyAndStop(t, b)
	conn, err := amqp.Dial(client.URL)
	if err != nil {
		t.Fatalf("connect to check the queues: %v", err)
	}
	defer conn.Close()
	for _, q := range []string{queues[0], queues[2]} {
		if d := queueDepth(t, conn, q); d != 0 {
			t.Errorf("%s holds %d messages at the end, want 0", q, d)
		}
	}
}

// clusterProbe publishes a message to a quorum queue every probeEvery and
// consumes it, on a connection to a node that stays up, reconnecting when
// that fails; it records when each message was sent and when it arrived.
type clusterProbe struct {
	mu      sync.Mutex
	sent    []time.Time       // by sequence number
	arrived map[int]time.Time // sequence number → first arrival
}

// probeEvery is the probe's period: the resolution of when it sees the
// cluster serve again.
const probeEvery = 50 * time.Millisecond

// startClusterProbe starts probing queue through the node at url until the
// test ends; it fails the test unless a first probe arrives within 15 s.
func startClusterProbe(t *testing.T, url, queue string) *clusterProbe {
	t.Helper()
	p := &clusterProbe{arrived: map[int]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			p.session(ctx, url, queue)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(probeEvery) {
		p.mu.Lock()
		n := len(p.arrived)
		p.mu.Unlock()
		if n > 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe: nothing arrived on %s within 15 s", queue)
		}
	}
}

// session probes on one connection until it fails or ctx ends.
func (p *clusterProbe) session(ctx context.Context, url, queue string) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("it-cluster-probe")
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	pub, err := conn.Channel()
	if err != nil {
		return
	}
	sub, err := conn.Channel()
	if err != nil {
		return
	}
	deliveries, err := sub.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		return
	}
	pubClosed := pub.NotifyClose(make(chan *amqp.Error, 1))
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case <-pubClosed:
			return
		case d, ok := <-deliveries:
			if !ok {
				return // the consumer was cancelled or its channel closed
			}
			if seq, err := strconv.Atoi(d.MessageId); err == nil {
				p.mu.Lock()
				if _, seen := p.arrived[seq]; !seen {
					p.arrived[seq] = time.Now()
				}
				p.mu.Unlock()
			}
		case <-tick.C:
			p.mu.Lock()
			seq := len(p.sent)
			p.sent = append(p.sent, time.Now())
			p.mu.Unlock()
			if err := pub.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: strconv.Itoa(seq)}); err != nil {
				return
			}
		}
	}
}

// servedAfter is the first arrival of a probe sent at or after at; false
// when none arrived.
func (p *clusterProbe) servedAfter(at time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first time.Time
	for seq, got := range p.arrived {
		if !p.sent[seq].Before(at) && (first.IsZero() || got.Before(first)) {
			first = got
		}
	}
	return first, !first.IsZero()
}
