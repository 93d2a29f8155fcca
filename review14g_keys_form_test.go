package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview14gKeysShowRecordForm: the README's rollback past this version
// ("Record format"): "first set RECORD_FORMAT=hash everywhere and wait for
// the longest TTL, or purge the keys still held as strings". The operator's
// tool for finding keys is `idemproxy keys list` / `get`, but neither says
// which form a record is kept in: a string record and a hash record print
// the same line, so the keys "still held as strings" cannot be found (the
// older binary's `keys list` skips them silently: it takes any non-hash for
// "not a record").
func TestReview14gKeysShowRecordForm(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	env := []string{"REDIS_URL=" + srv.URL()}
	terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
	keys := map[string]claim.Key{}
	for _, form := range []string{"hash", "string"} {
		s := claim.NewStore(rdb, "idem:", nil, claim.StringRecords(form == "string"))
		k := claim.NewKey([]string{""}, "form-"+form)
		keys[form] = k
		lease, _, err := s.Acquire(ctx, k, claim.Fingerprint{1}, terms)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("ok")}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if typ := rdb.Type(ctx, claim.RecordKey("idem:", k)).Val(); typ != form {
			t.Fatalf("%s store wrote a Redis %s", form, typ)
		}
	}
	line := func(out string, k claim.Key) string {
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, k.String()) {
				return strings.ReplaceAll(normalise(l), k.String(), "KEY")
			}
		}
		t.Fatalf("no line for %s in %q", k, out)
		return ""
	}
	list := keysOK(t, env, "list")
	h, s := line(list, keys["hash"]), line(list, keys["string"])
	if h == s {
		t.Errorf("keys list prints a hash record and a string record alike:\n hash   %s\n string %s\nwant the form shown, so that the README's rollback step (purge the keys still held as strings) can be done", h, s)
	}
	hg, sg := line(keysOK(t, env, "get", keys["hash"].String()), keys["hash"]), line(keysOK(t, env, "get", keys["string"].String()), keys["string"])
	if hg == sg {
		t.Errorf("keys get prints a hash record and a string record alike:\n hash   %s\n string %s", hg, sg)
	}
}
