package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestBinaryInMemoryCgroup runs the real binary in a memory cgroup of its
// own with a 200 MiB limit, as a container runs it, and reads the limit it
// set in its start log. It needs a cgroup it may create (root, cgroup v1's
// memory controller, or v2 with memory delegated); elsewhere it is skipped,
// and the root package's TestApplyMemoryLimit covers the logic with the limit stood in for.
func TestBinaryInMemoryCgroup(t *testing.T) {
	t.Parallel()
	dir, limitFile := childMemoryCgroup(t)
	const limit = 200 << 20
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(fmt.Sprint(limit)), 0o644); err != nil {
		t.Skipf("cannot limit the test cgroup: %v", err)
	}
	// A process may be refused the cgroup (cgroup v2 keeps processes out
	// of a cgroup whose parent has some of its own, as ours has).
	if out, err := exec.Command("/bin/sh", "-c", `echo $$ > "$1/cgroup.procs"`, "sh", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot join the test cgroup: %v %s", err, out)
	}
	// The shell joins the cgroup, then becomes the proxy (same pid).
	p := startProc(t, []string{"/bin/sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2"`, "sh", dir, binary},
		"UPSTREAM_URL=http://127.0.0.1:9", "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "MAX_BUFFERED_BYTES=134217728")
	want := fmt.Sprintf(`"container_memory_limit":%d,"gomemlimit":%d`, limit, int64(float64(limit)*0.9))
	testutil.Eventually(t, 10*time.Second, "the start log", func() bool { return strings.Contains(p.stdout.String(), "idemproxy started") })
	out := p.stdout.String()
	if !strings.Contains(out, want) {
		t.Errorf("start log lacks %s:\n%s", want, out)
	}
	if !strings.Contains(out, "MAX_BUFFERED_BYTES=134217728 and REPLAY_CACHE_BYTES=16777216 need about 302 MiB") {
		t.Errorf("start log lacks the sizing warning:\n%s", out)
	}
}

// childMemoryCgroup makes a memory cgroup under the test's own and returns
// it with the name of its limit file, or skips the test.
func childMemoryCgroup(t *testing.T) (dir, limitFile string) {
	t.Helper()
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	defer f.Close()
	var v1, v2 string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			v1 = parts[2]
		}
	}
	switch {
	case v1 != "":
		dir, limitFile = filepath.Join("/sys/fs/cgroup/memory", v1, fmt.Sprintf("idemproxy-test-%d", os.Getpid())), "memory.limit_in_bytes"
	case v2 != "":
		dir, limitFile = filepath.Join("/sys/fs/cgroup", v2, fmt.Sprintf("idemproxy-test-%d", os.Getpid())), "memory.max"
	default:
		t.Skip("no memory cgroup")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a memory cgroup: %v", err)
	}
	t.Cleanup(func() {
		// Empty once its processes have exited (startProc's cleanup, which
		// runs first, waits for that).
		for i := 0; i < 50; i++ {
			if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", dir)
	})
	if _, err := os.Stat(filepath.Join(dir, limitFile)); err != nil {
		t.Skipf("no memory controller in %s: %v", dir, err)
	}
	return dir, limitFile
}
