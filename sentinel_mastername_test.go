package main

import (
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKeysWrongMasterNameNamesIt (review17b): REDIS_MASTER_NAME with
// a typo (or the chart's default "mymaster" against sentinels that monitor
// "redis-ha"). Every sentinel answers, each saying it monitors no such
// master; keys reports "Redis (REDIS_MODE=sentinel REDIS_ADDRS=...): ...
// all sentinels specified in configuration are unreachable: redis: nil".
// The message names neither REDIS_MASTER_NAME nor its value, and says the
// reverse of what happened (the sentinels were reached): at 3 a.m. the
// operator goes after the network.
func TestKeysWrongMasterNameNamesIt(t *testing.T) {
	s := redistest.StartSentinel(t)
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=mymastr"}
	hash := claim.NewKey([]string{""}, "k").String()
	for _, args := range [][]string{{"get", hash}, {"list"}, {"purge", hash}} {
		_, errOut, code := keysRun(t, env, append(args, "--timeout", "5s")...)
		if code != 1 || !strings.Contains(errOut, `REDIS_MASTER_NAME`) || !strings.Contains(errOut, "mymastr") || strings.Contains(errOut, "unreachable") {
			t.Errorf("keys %s with sentinels that monitor %q and REDIS_MASTER_NAME=mymastr: exit %d, stderr %q; want exit 1 and a message naming REDIS_MASTER_NAME=\"mymastr\" (unknown to the sentinels), not \"unreachable\"",
				args[0], s.MasterName(), code, strings.TrimSpace(errOut))
		}
	}
}

// TestProxyWrongMasterNameNamesIt: the proxy's own log says the same as
// keys: not "unreachable", but which REDIS_MASTER_NAME no sentinel knows.
func TestProxyWrongMasterNameNamesIt(t *testing.T) {
	s := redistest.StartSentinel(t)
	up := newUpstream(t)
	_, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=",
		"REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=mymastr")
	if out := logs.String(); !strings.Contains(out, `REDIS_MASTER_NAME=\"mymastr\"`) || !strings.Contains(out, "none monitors a master of that name") {
		t.Errorf("proxy log with REDIS_MASTER_NAME=mymastr (sentinels monitor %q): want the name and \"none monitors a master of that name\"; got:\n%s", s.MasterName(), out)
	}
}
