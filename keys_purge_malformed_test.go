package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKeysPurgeStateMalformedRecord: a record whose answer does not decode
// still has a state: `list --state` shows it (with its error) and `purge
// --state` judges it by that. (Found by review: list --state left it out,
// and purge failed with a message blaming Redis, leaving the runbook stuck.)
func TestKeysPurgeStateMalformedRecord(t *testing.T) {
	srv := redistest.Start(t)
	env := []string{"REDIS_URL=" + srv.URL()}
	rdb := srv.Client()
	ctx := context.Background()
	for _, c := range []struct{ state, st, rec string }{
		{"completed", "c", "garbage"},
		{"unknown", "u", "abc"},
	} {
		k := claim.NewKey(nil, "malformed-"+c.state)
		rdb.HSet(ctx, claim.RecordKey("idem:", k), "st", c.st, "fp", "x", "rec", c.rec)
		for _, args := range [][]string{{"list"}, {"list", "--state", c.state}} {
			list := keysOK(t, env, args...)
			if !strings.Contains(list, `"key_hash":"`+k.String()+`","state":"`+c.state+`"`) || !strings.Contains(list, `"error":`) {
				t.Fatalf("keys %v does not show the record as %s, with its error: %s", args, c.state, list)
			}
		}
		out, errOut, code := keysRun(t, env, "purge", "--state", c.state, k.String())
		n, _ := rdb.Exists(ctx, claim.RecordKey("idem:", k)).Result()
		if code != 0 || n != 0 {
			t.Errorf("keys purge --state %s of a record `keys list` shows as %s: exit %d, record left %d\nstdout %q\nstderr %s",
				c.state, c.state, code, n, out, errOut)
		}
	}
}
