package redistest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Sentinel is a Redis Sentinel deployment owned by one test: one master, one
// replica (replicaof) and three sentinels monitoring the master as
// "mymaster" with quorum 2, down-after-milliseconds 1000 and
// failover-timeout 5000. Every process listens on a free loopback port and
// is killed by pid when the test ends.
type Sentinel struct {
	t         testing.TB
	name      string
	data      []*Server // the master and the replica, in start order
	sentinels []*sentinelProc
}

// SentinelOptions configures StartSentinelWith.
type SentinelOptions struct {
	// Extra are more config lines for the two data nodes.
	Extra []string
	// Password, when set, is required by every sentinel (requirepass; the
	// sentinels authenticate to each other with it too, sentinel-pass).
	// The data nodes are not affected.
	Password string
}

// sentinelProc is one `redis-server <file> --sentinel` process. Sentinels
// rewrite their config file, so it lives in a temporary directory instead
// of arriving on stdin.
type sentinelProc struct {
	port int
	pass string // requirepass, or ""
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// do runs one command on the sentinel, authenticated when it needs it.
func (p *sentinelProc) do(args ...any) (any, error) { return nodeDoAuth(p.addr(), p.pass, args...) }

// StartSentinel starts the master, the replica and the three sentinels, and
// waits until the replica is in sync and every sentinel sees it and the two
// other sentinels. extra are more config lines for the two data nodes.
func StartSentinel(t testing.TB, extra ...string) *Sentinel {
	t.Helper()
	return StartSentinelWith(t, SentinelOptions{Extra: extra})
}

// StartSentinelWith is StartSentinel with options, such as sentinels that
// require a password.
func StartSentinelWith(t testing.TB, o SentinelOptions) *Sentinel {
	t.Helper()
	extra := o.Extra
	s := &Sentinel{t: t, name: "mymaster"}
	master := Start(t, extra...)
	replica := Start(t, append([]string{"replicaof 127.0.0.1 " + strconv.Itoa(master.Port())}, extra...)...)
	s.data = []*Server{master, replica}
	WaitReplicated(t, master, replica, 10*time.Second)
	bin := Binary(t)
	for range 3 {
		p := &sentinelProc{port: FreePort(t), pass: o.Password}
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		lines := []string{
			"bind 127.0.0.1",
			"port " + strconv.Itoa(p.port),
			"dir " + dir,
			"protected-mode no",
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", s.name, master.Port()),
			"sentinel down-after-milliseconds " + s.name + " 1000",
			"sentinel failover-timeout " + s.name + " 5000",
			"sentinel parallel-syncs " + s.name + " 1",
		}
		if o.Password != "" {
			lines = append(lines, "requirepass "+o.Password, "sentinel sentinel-pass "+o.Password)
		}
		if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatalf("write sentinel config: %v", err)
		}
		p.start(t, bin, conf)
		t.Cleanup(p.kill)
		s.sentinels = append(s.sentinels, p)
	}
	s.waitDiscovered(20 * time.Second)
	return s
}

func (p *sentinelProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *sentinelProc) start(t testing.TB, bin, conf string) {
	t.Helper()
	cmd := exec.Command(bin, conf, "--sentinel")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("sentinel stdout: %v", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sentinel: %v", err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	go func() { // drain, so it never blocks on a full pipe
		sc := bufio.NewScanner(out)
		for sc.Scan() {
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := p.do("PING")
		if err == nil && v == "PONG" {
			return
		}
		if time.Now().After(deadline) {
			p.kill()
			t.Fatalf("sentinel on port %d does not answer PING after 10s: %v", p.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the sentinel this test started, by pid, and waits for it.
func (p *sentinelProc) kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Addrs returns host:port of the three sentinels.
func (s *Sentinel) Addrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr()
	}
	return addrs
}

// MasterName is the name the sentinels monitor ("mymaster").
func (s *Sentinel) MasterName() string { return s.name }

// flatMaps turns a RESP2 array of flat [k v k v ...] arrays into maps.
func flatMaps(v any) ([]map[string]string, error) {
	rows, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply %T", v)
	}
	var out []map[string]string
	for _, r := range rows {
		kv, ok := r.([]any)
		if !ok || len(kv)%2 != 0 {
			return nil, fmt.Errorf("unexpected row %v", r)
		}
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[fmt.Sprint(kv[i])] = fmt.Sprint(kv[i+1])
		}
		out = append(out, m)
	}
	return out, nil
}

// waitDiscovered waits until each sentinel sees the replica as a healthy
// replica and knows the two other sentinels: only then can it fail over.
func (s *Sentinel) waitDiscovered(timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	replicaPort := strconv.Itoa(s.data[1].Port())
	var last error
	for {
		last = nil
		for _, p := range s.sentinels {
			v, err := p.do("SENTINEL", "REPLICAS", s.name)
			if err != nil {
				last = err
				break
			}
			reps, err := flatMaps(v)
			if err != nil {
				last = err
				break
			}
			ok := false
			for _, r := range reps {
				if r["port"] == replicaPort && r["flags"] == "slave" && r["master-link-status"] == "ok" {
					ok = true
				}
			}
			if !ok {
				last = fmt.Errorf("sentinel %s does not see replica %s yet: %v", p.addr(), replicaPort, reps)
				break
			}
			v, err = p.do("SENTINEL", "SENTINELS", s.name)
			if err != nil {
				last = err
				break
			}
			if others, err := flatMaps(v); err != nil || len(others) != len(s.sentinels)-1 {
				last = fmt.Errorf("sentinel %s knows %d other sentinels (%v)", p.addr(), len(others), err)
				break
			}
		}
		if last == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("sentinels not ready after %s: %v", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// masterAddrFrom asks one sentinel for the master's address.
func (s *Sentinel) masterAddrFrom(p *sentinelProc) (string, error) {
	v, err := p.do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.name)
	if err != nil {
		return "", err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name: unexpected reply %v", v)
	}
	return fmt.Sprintf("%v:%v", arr[0], arr[1]), nil
}

func (s *Sentinel) server(addr string) *Server {
	for _, d := range s.data {
		if d.Addr() == addr {
			return d
		}
	}
	return nil
}

// Master returns the data node the first sentinel names as master.
func (s *Sentinel) Master() *Server {
	s.t.Helper()
	addr, err := s.masterAddrFrom(s.sentinels[0])
	if err != nil {
		s.t.Fatalf("sentinel %s: %v", s.sentinels[0].addr(), err)
	}
	m := s.server(addr)
	if m == nil {
		s.t.Fatalf("sentinels name %s as master, which is not ours", addr)
	}
	return m
}

// Replica returns the data node that is not Master.
func (s *Sentinel) Replica() *Server {
	s.t.Helper()
	m := s.Master()
	for _, d := range s.data {
		if d != m {
			return d
		}
	}
	return nil
}

// Failover runs SENTINEL FAILOVER and waits, at most timeout, until every
// sentinel names the other data node as master and that node answers ROLE
// as master. It returns the new master.
//
// It does not wait for the old master to be turned into a replica: Sentinel
// does that a few seconds later, and until then the old master still accepts
// writes from clients that have not switched (they are lost when it is
// reconfigured). Tests must not rely on writes made in that window.
func (s *Sentinel) Failover(timeout time.Duration) *Server {
	s.t.Helper()
	old := s.Master()
	deadline := time.Now().Add(timeout)
	for {
		// NOGOODSLAVE or INPROG can answer for a moment; retry until the deadline.
		_, err := s.sentinels[0].do("SENTINEL", "FAILOVER", s.name)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("SENTINEL FAILOVER %s: %v", s.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var last error
	for {
		last = nil
		var addr string
		for _, p := range s.sentinels {
			a, err := s.masterAddrFrom(p)
			switch {
			case err != nil:
				last = err
			case a == old.Addr():
				last = fmt.Errorf("sentinel %s still names %s", p.addr(), a)
			case addr != "" && a != addr:
				last = fmt.Errorf("sentinels disagree: %s and %s", addr, a)
			}
			if last != nil {
				break
			}
			addr = a
		}
		if last == nil {
			m := s.server(addr)
			if m == nil {
				s.t.Fatalf("sentinels name %s as master, which is not ours", addr)
			}
			role, _, err := Role(m)
			if err == nil && role == "master" {
				return m
			}
			last = fmt.Errorf("new master %s answers ROLE %q (%v)", addr, role, err)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("failover of %s not done after %s: %v", s.name, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
