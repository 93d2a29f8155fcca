package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKeysPurgeState: `keys purge --state` deletes only a record in that
// state; otherwise it prints the state found, deletes nothing and exits 1.
// A bad --state is a usage error, and so is `--state ""` (a script's unset
// variable), never a purge without a check (found by review: it deleted
// whatever was there).
func TestKeysPurgeState(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	rdb := srv.Client()
	ctx := context.Background()
	s := claim.NewStore(rdb, "idem:", nil)
	k := completedKey(t, s, "purge-state")
	hash := k.String()

	out, errOut, code := keysRun(t, env, "purge", hash, "--state", "in_flight")
	if code != 1 || strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":false,"state":"completed"}` ||
		!strings.Contains(errOut, "its record is completed, not --state=in_flight") {
		t.Errorf("purge --state in_flight of a completed record: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result(); n != 1 {
		t.Fatal("the refused purge deleted the record")
	}
	out = keysOK(t, env, "purge", "--state", "completed", hash)
	if strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":true}` {
		t.Errorf("purge --state completed: %s", out)
	}
	if n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result(); n != 0 {
		t.Error("the record is still there after purge --state completed")
	}
	out, errOut, code = keysRun(t, env, "purge", hash, "--state", "completed")
	if code != 1 || !strings.Contains(out, `"state":""`) || !strings.Contains(errOut, "no record") {
		t.Errorf("purge --state of no record: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if _, errOut, code = keysRun(t, env, "purge", hash, "--state", "done"); code != 2 || !strings.Contains(errOut, `--state="done"`) {
		t.Errorf("purge --state done: exit %d, stderr %s; want a usage error naming the value", code, errOut)
	}
	for _, args := range [][]string{{"--state", ""}, {"--state="}} {
		k := completedKey(t, s, "empty-state-"+strings.Join(args, ""))
		out, errOut, code := keysRun(t, env, append([]string{"purge", k.String()}, args...)...)
		n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result()
		if code != 2 || n != 1 {
			t.Errorf("keys purge %q of a completed record: exit %d, record left %d\nstdout %s\nstderr %s\nwant a usage error (exit 2) and the record kept",
				args, code, n, out, errOut)
		}
	}
}
