package main

// Tests of help.go: --help and the usage errors of the command line.

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRunHelp: --help and -h print the help on stdout and succeed, without
// needing a configuration.
func TestRunHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-help", "-h"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{"idemproxy", arg}, nil, &stdout, &stderr)
		if err != nil || exitCode(err) != 0 {
			t.Fatalf("run %s: got %v (exit %d), want nil", arg, err, exitCode(err))
		}
		if stderr.Len() != 0 {
			t.Errorf("run %s: stderr %q, want nothing", arg, stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{
			"Idempotency-Key", "keys", "environment variables", "config.example.env",
			"UPSTREAM_URL", "REDIS_URL", "LISTEN_ADDR", "README",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("run %s: help lacks %q:\n%s", arg, want, out)
			}
		}
		if strings.Contains(out, "flag: help requested") {
			t.Errorf("run %s: help has the flag package's message:\n%s", arg, out)
		}
	}
}

// TestRunUsageErrors: an unknown flag, an unknown command and keys without
// a known command exit 2 with the mistake and the usage on stderr, and start
// nothing (no UPSTREAM_URL is set, so starting would fail differently).
func TestRunUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"keys"}, "keys: a command is needed"},
		{[]string{"keys", "drop"}, "keys: unknown command (an argument of 4 characters, not shown"},
		{[]string{"serve"}, `unknown command "serve"`},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"idemproxy"}, tc.args...), nil, &stdout, &stderr)
		if got := exitCode(err); got != 2 {
			t.Errorf("run %q: exit %d (%v), want 2", tc.args, got, err)
		}
		if !strings.Contains(stderr.String(), tc.want) || !strings.Contains(stderr.String(), "Usage: idemproxy") {
			t.Errorf("run %q: stderr %q, want %q and the usage", tc.args, stderr.String(), tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("run %q: stdout %q, want nothing", tc.args, stdout.String())
		}
	}
	if got := exitCode(run(context.Background(), []string{"idemproxy"}, nil, &bytes.Buffer{}, &bytes.Buffer{})); got != 1 {
		t.Errorf("run without UPSTREAM_URL: exit %d, want 1", got)
	}
}
