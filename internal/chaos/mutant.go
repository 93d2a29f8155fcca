package chaos

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// fenceCheck is the token comparison of scripts/complete.lua's general path:
// a completion whose claim is no longer the record's (its lock expired and
// another request took the key over) writes nothing and answers "lost".
//
// When the record format of the scripts changes, update this text (and
// nothing else) so that RemoveCompletionFence still finds the check;
// TestRemoveCompletionFenceApplies fails until it does.
const fenceCheck = "if cur.tok ~= ARGV[1] then\n  return {'lost'}\nend\n"

// RemoveCompletionFence returns complete.lua's source without its fencing
// check (the token comparison), so that a late completion of an expired,
// taken-over claim is written as if it were still the claimant's. It fails
// loudly when the check is not found exactly once: a mutation that no
// longer applies must not pass for a broken build that is not broken.
func RemoveCompletionFence(src string) (string, error) {
	if n := strings.Count(src, fenceCheck); n != 1 {
		return "", fmt.Errorf("RemoveCompletionFence: the fencing check %q occurs %d times in complete.lua, want exactly 1: "+
			"the script changed; update fenceCheck in internal/chaos/mutant.go", fenceCheck, n)
	}
	out := strings.Replace(src, fenceCheck, "-- (chaos mutant: fencing check removed)\n", 1)
	if strings.Contains(out, "return {'lost'}") {
		return "", errors.New("RemoveCompletionFence: complete.lua still answers 'lost' somewhere after the mutation: update fenceCheck")
	}
	return out, nil
}

// BuildMutant copies the module at root (without .git and bin) into a new
// directory under dir, removes the completion fence from its
// scripts/complete.lua, and builds that copy's binary. It returns the
// binary's path.
func BuildMutant(root, dir string) (string, error) {
	copyDir := filepath.Join(dir, "mutant-src")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (rel == ".git" || rel == "bin" || rel == "charts") {
			return filepath.SkipDir
		}
		target := filepath.Join(copyDir, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("copy module: %w", err)
	}
	script := filepath.Join(copyDir, "scripts", "complete.lua")
	src, err := os.ReadFile(script)
	if err != nil {
		return "", err
	}
	mutated, err := RemoveCompletionFence(string(src))
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(script, []byte(mutated), 0o644); err != nil {
		return "", err
	}
	return buildBinary(copyDir, filepath.Join(dir, "idemproxy-mutant"))
}

// buildBinary runs `go build` of the module at root into out.
func buildBinary(root, out string) (string, error) {
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, ".")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %v\n%s", root, err, b)
	}
	return out, nil
}

// moduleRoot finds the directory of go.mod above the working directory
// (a test runs in its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
