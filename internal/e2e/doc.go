// Package e2e holds the end-to-end tests of idemproxy: they build the binary
// once (TestMain), run it as a child process against real redis-server
// processes, Redis Cluster and Sentinel (internal/redistest), kill and
// restart those, drive `make run`, and read what the proxy says through its
// interfaces only: its answers, /readyz and /metrics on the admin listener,
// its JSON log on stdout, and `idemproxy keys` as a subprocess.
//
// Run them with `go test ./internal/e2e/...` (`make test-integration`);
// `make test` runs them with the rest.
package e2e
