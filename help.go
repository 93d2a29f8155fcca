package main

import (
	"errors"
	"fmt"
	"io"
)

// helpText is what `idemproxy --help` prints.
const helpText = `idemproxy makes retries of non-idempotent HTTP APIs safe: a request carrying
an Idempotency-Key is claimed atomically in Redis, forwarded once, and every
retry with that key gets the recorded answer back.

Usage:
  idemproxy             run the proxy (stop it with SIGTERM or Ctrl-C)
  idemproxy --version   print the version
  idemproxy --help      print this help

Commands:
  keys hash|get|list|purge|forget
                        operator commands on the records in Redis: the key_hash
                        of a key, read, list or purge a record, tell the proxies
                        to forget one (idemproxy keys --help; they need the
                        proxies' shared Redis)

Configuration comes from environment variables only; config.example.env lists
every one with its default. A malformed value stops the proxy at start, naming
the variable. The most important:

  UPSTREAM_URL     base URL of the protected API (required)
  LISTEN_ADDR      proxy listener (default :8080)
  ADMIN_ADDR       /metrics, /healthz, /readyz (default :9090; empty disables)
  REDIS_URL        redis:// or rediss:// URL; empty: an embedded Redis, for one
                   replica only. REDIS_MODE=sentinel|cluster uses REDIS_ADDRS
  TTL              how long a completed answer is replayed (default 24h)
  LOCK_TTL         how long an in-flight claim holds (default 60s)
  FAIL_MODE        Redis unreachable: closed answers 503, open forwards
  ROUTES           per-route overrides, e.g. "POST /v1/payments/* ttl=48h required"
  LOG_FORMAT       json (default) or console

Documentation: README.md in the source tree (github.com/idemproxy/idemproxy).
`

// usage is what a command-line mistake prints to stderr, after the error.
const usage = `Usage: idemproxy [--version | --help]
Configuration is read from environment variables; run idemproxy --help for more.
`

// usageError is a command-line mistake. run has already written it and the
// usage to stderr; the process exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// badUsage writes the mistake and the usage to stderr and returns the error
// for run to return.
func badUsage(stderr io.Writer, err error) error {
	fmt.Fprintf(stderr, "idemproxy: %v\n%s", err, usage)
	return usageError{err}
}

// exitCode is the process's exit status for run's error: 2 for a
// command-line mistake, 1 for anything else (0 for none).
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	default:
		return 1
	}
}
