package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of three masters with one replica each, every
// node a redis-server owned by one test (persistence off, loopback ports).
// Nodes are killed by pid only, and all of them when the test ends.
type Cluster struct {
	t     testing.TB
	nodes []*Server
}

// CLIBinary returns the path of redis-cli, or fails t with how to install it.
func CLIBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found on PATH: the Cluster tests create their cluster with `redis-cli --cluster create`. " +
			"Install it with `make deps` (apt-get install -y redis-server, which ships redis-cli) and run again")
	}
	return bin
}

// StartCluster starts six nodes (cluster-enabled, cluster-node-timeout 1000,
// their cluster config in a temporary directory), joins them with
// `redis-cli --cluster create --cluster-replicas 1`, and waits until every
// node reports cluster_state:ok with all slots covered and every replica is
// in sync. extra are more config lines for every node.
func StartCluster(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	cli := CLIBinary(t)
	c := &Cluster{t: t}
	for range 6 {
		dir := t.TempDir()
		// The bus port is normally port+10000, which may be taken or out of
		// range; Redis 7 lets us pick a free one.
		lines := append([]string{
			"cluster-enabled yes",
			"cluster-node-timeout 1000",
			"cluster-config-file " + filepath.Join(dir, "nodes.conf"),
			"cluster-port " + strconv.Itoa(FreePort(t)),
		}, extra...)
		c.nodes = append(c.nodes, Start(t, lines...))
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(30 * time.Second)
	for _, m := range c.Masters() {
		if r := c.ReplicaOf(m); r != nil {
			WaitReplicated(t, m, r, 10*time.Second)
		}
	}
	return c
}

// Nodes returns every node, running or not, in start order.
func (c *Cluster) Nodes() []*Server { return c.nodes }

// Addrs returns host:port of every node, usable as cluster seeds.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// nodeDo runs one command on one node with a short timeout and no retries.
func nodeDo(addr string, args ...any) (any, error) { return nodeDoAuth(addr, "", args...) }

// nodeDoAuth is nodeDo on a node that requires password ("" for none).
func nodeDoAuth(addr, password string, args ...any) (any, error) {
	// RESP2: flat arrays and plain strings, whatever the command.
	cl := redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: 2, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return cl.Do(ctx, args...).Result()
}

// Role returns what ROLE reports for s ("master" or "slave"), and for a
// replica the port of its master.
func Role(s *Server) (role string, masterPort int, err error) {
	v, err := nodeDo(s.Addr(), "ROLE")
	if err != nil {
		return "", 0, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return "", 0, fmt.Errorf("ROLE on %s: unexpected reply %v", s.Addr(), v)
	}
	role, _ = arr[0].(string)
	if role == "slave" && len(arr) >= 3 {
		if p, ok := arr[2].(int64); ok {
			masterPort = int(p)
		}
	}
	return role, masterPort, nil
}

// Masters returns the running nodes that answer ROLE as master.
func (c *Cluster) Masters() []*Server {
	var ms []*Server
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		if role, _, err := Role(n); err == nil && role == "master" {
			ms = append(ms, n)
		}
	}
	return ms
}

// ReplicaOf returns the running node that replicates m, or nil.
func (c *Cluster) ReplicaOf(m *Server) *Server {
	for _, n := range c.nodes {
		if n == m || !n.Running() {
			continue
		}
		if role, port, err := Role(n); err == nil && role == "slave" && port == m.Port() {
			return n
		}
	}
	return nil
}

// node returns the node listening on port, or nil.
func (c *Cluster) node(port int) *Server {
	for _, n := range c.nodes {
		if n.Port() == port {
			return n
		}
	}
	return nil
}

// anyRunning returns a running node; the cluster has always one in a test.
func (c *Cluster) anyRunning() *Server {
	for _, n := range c.nodes {
		if n.Running() {
			return n
		}
	}
	c.t.Fatalf("redistest: no cluster node is running")
	return nil
}

// KeySlot asks the cluster (CLUSTER KEYSLOT) which hash slot key is in.
func (c *Cluster) KeySlot(key string) int {
	c.t.Helper()
	v, err := nodeDo(c.anyRunning().Addr(), "CLUSTER", "KEYSLOT", key)
	if err != nil {
		c.t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	return int(v.(int64))
}

// slotRange is one entry of CLUSTER SLOTS: slots [from, to] served by the
// master on port.
type slotRange struct{ from, to, port int }

func clusterSlots(addr string) ([]slotRange, error) {
	v, err := nodeDo(addr, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, err
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("CLUSTER SLOTS on %s: unexpected reply %T", addr, v)
	}
	var out []slotRange
	for _, e := range arr {
		row, ok := e.([]any)
		if !ok || len(row) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS on %s: bad row %v", addr, e)
		}
		from, ok1 := row[0].(int64)
		to, ok2 := row[1].(int64)
		master, ok3 := row[2].([]any)
		if !ok1 || !ok2 || !ok3 || len(master) < 2 {
			return nil, fmt.Errorf("CLUSTER SLOTS on %s: bad row %v", addr, e)
		}
		port, ok := master[1].(int64)
		if !ok {
			return nil, fmt.Errorf("CLUSTER SLOTS on %s: bad port %v", addr, master[1])
		}
		out = append(out, slotRange{int(from), int(to), int(port)})
	}
	return out, nil
}

// NodeForKey returns the master that serves key's slot, as CLUSTER SLOTS on
// a running node reports it.
func (c *Cluster) NodeForKey(key string) *Server {
	c.t.Helper()
	slot := c.KeySlot(key)
	ranges, err := clusterSlots(c.anyRunning().Addr())
	if err != nil {
		c.t.Fatalf("%v", err)
	}
	for _, r := range ranges {
		if slot >= r.from && slot <= r.to {
			if n := c.node(r.port); n != nil {
				return n
			}
			c.t.Fatalf("slot %d is served by port %d, which is not ours", slot, r.port)
		}
	}
	c.t.Fatalf("slot %d of %q is not covered", slot, key)
	return nil
}

// KillMaster SIGKILLs m, which must be a master (by pid, see Server.Kill).
func (c *Cluster) KillMaster(m *Server) {
	c.t.Helper()
	if role, _, err := Role(m); err != nil || role != "master" {
		c.t.Fatalf("KillMaster %s: ROLE is %q (%v), want master", m.Addr(), role, err)
	}
	m.Kill()
}

// FlushScripts runs SCRIPT FLUSH on every running node, as if each had just
// been started or promoted.
func (c *Cluster) FlushScripts() {
	c.t.Helper()
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		if _, err := nodeDo(n.Addr(), "SCRIPT", "FLUSH"); err != nil {
			c.t.Fatalf("SCRIPT FLUSH on %s: %v", n.Addr(), err)
		}
	}
}

// WaitHealthy waits, at most timeout, until every running node reports
// cluster_state:ok with all 16384 slots ok, and all of them agree, through
// CLUSTER SLOTS, on one running master for every slot.
func (c *Cluster) WaitHealthy(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = c.healthy(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redis cluster not healthy after %s: %v", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) healthy() error {
	var want string
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		v, err := nodeDo(n.Addr(), "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", n.Addr(), err)
		}
		info, _ := v.(string)
		for _, need := range []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384"} {
			if !strings.Contains(info, need+"\r\n") {
				return fmt.Errorf("%s: CLUSTER INFO lacks %s", n.Addr(), need)
			}
		}
		ranges, err := clusterSlots(n.Addr())
		if err != nil {
			return err
		}
		covered := 0
		var b strings.Builder
		for _, r := range ranges {
			m := c.node(r.port)
			if m == nil || !m.Running() {
				return fmt.Errorf("%s: slots %d-%d served by port %d, which is down", n.Addr(), r.from, r.to, r.port)
			}
			covered += r.to - r.from + 1
		}
		if covered != 16384 {
			return fmt.Errorf("%s: CLUSTER SLOTS covers %d slots", n.Addr(), covered)
		}
		// The same mapping seen from every node (order-independent).
		seen := make([]int, 16384)
		for _, r := range ranges {
			for s := r.from; s <= r.to; s++ {
				seen[s] = r.port
			}
		}
		for s := 0; s < 16384; s += 64 {
			fmt.Fprintf(&b, "%d,", seen[s])
		}
		if want == "" {
			want = b.String()
		} else if want != b.String() {
			return fmt.Errorf("%s: its slot map differs from another node's", n.Addr())
		}
	}
	// Every node that serves slots must itself say it is a master.
	ranges, err := clusterSlots(c.anyRunning().Addr())
	if err != nil {
		return err
	}
	for _, r := range ranges {
		m := c.node(r.port)
		if role, _, err := Role(m); err != nil || role != "master" {
			return fmt.Errorf("%s serves slots %d-%d but ROLE is %q (%v)", m.Addr(), r.from, r.to, role, err)
		}
	}
	return nil
}

// replOffset reads an offset field of INFO replication.
func replOffset(s *Server, field string) (int64, error) {
	v, err := nodeDo(s.Addr(), "INFO", "replication")
	if err != nil {
		return 0, err
	}
	info, _ := v.(string)
	for line := range strings.SplitSeq(info, "\r\n") {
		if val, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(val, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: INFO replication has no %s", s.Addr(), field)
}

// WaitReplicated waits, at most timeout, until replica has processed every
// write master had accepted when it was called: the replica's
// slave_repl_offset reaches the master's master_repl_offset.
//
// This is what a test needs before killing a master: unlike WAIT sent on a
// fresh connection (WAIT only covers writes made on its own connection), it
// covers the writes of every client, the proxy's included.
func WaitReplicated(t testing.TB, master, replica *Server, timeout time.Duration) {
	t.Helper()
	want, err := replOffset(master, "master_repl_offset")
	if err != nil {
		t.Fatalf("read master offset: %v", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := replOffset(replica, "slave_repl_offset")
		if err == nil && got >= want {
			if link, _ := nodeDo(replica.Addr(), "INFO", "replication"); strings.Contains(fmt.Sprint(link), "master_link_status:up") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s did not reach offset %d of master %s within %s (at %d, %v)",
				replica.Addr(), want, master.Addr(), timeout, got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
