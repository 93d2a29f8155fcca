package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// parallelTests is how many tests run at once unless -parallel says
// otherwise: these tests mostly wait on child processes (a failover, a lock
// TTL, a soak's storm), not on the CPU.
const parallelTests = 4

var (
	// moduleRoot is the directory of idemproxy's go.mod.
	moduleRoot string
	// binary is idemproxy built from moduleRoot for this run of the
	// package's tests, with -race when the tests run with it.
	binary string
)

// TestMain builds the binary once for every test of the package.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run()) // -list runs nothing: no binary needed
	}
	testutil.DefaultParallel(parallelTests)
	dir, err := os.MkdirTemp("", "idemproxy-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := buildThenRun(m, dir)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func buildThenRun(m *testing.M, dir string) int {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		fmt.Fprintf(os.Stderr, "e2e: go env GOMOD: %q %v: run the tests inside the idemproxy module\n", gomod, err)
		return 1
	}
	moduleRoot = filepath.Dir(gomod)
	binary = filepath.Join(dir, "idemproxy")
	args := []string{"build", "-o", binary}
	if raceEnabled {
		// The product code these tests drive is checked for races as when
		// the same tests ran in-process under -race.
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Dir = moduleRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go %s (in %s): %v\n%s", strings.Join(args, " "), moduleRoot, err, out)
		return 1
	}
	return m.Run()
}
