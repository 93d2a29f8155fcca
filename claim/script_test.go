package claim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// TestScriptsAreIdempotentPerToken: go-redis resends a script whose reply
// was lost; the resent claim or completion must see its own earlier write
// as success, not as someone else's claim.
func TestScriptsAreIdempotentPerToken(t *testing.T) {
	srv := redistest.Start(t)
	s := NewStore(srv.Client(), "test:", nil)
	ctx := context.Background()
	keys := s.keys(NewKey(nil, "resend"))
	fp := string(make([]byte, 32))
	for i := range 2 {
		v, err := claimScript.Run(ctx, s.rdb, keys, "token-1", fp, ms(time.Minute), ms(time.Hour), "", "").Result()
		status, _, err := decodeReply(v, err)
		if err != nil || status != "claimed" {
			t.Fatalf("claim #%d with the same token: %q, %v; want claimed", i+1, status, err)
		}
	}
	v, err := claimScript.Run(ctx, s.rdb, keys, "token-2", fp, ms(time.Minute), ms(time.Hour), "", "").Result()
	if status, _, _ := decodeReply(v, err); status != "inflight" {
		t.Fatalf("claim with another token: %q, want inflight", status)
	}
	rec := (&Record{Status: 201}).Encode()
	for i := range 2 {
		v, err := completeScript.Run(ctx, s.rdb, keys, "token-1", rec, ms(time.Hour), fp, "", "c").Result()
		if status, _, err := decodeReply(v, err); err != nil || status != "ok" {
			t.Fatalf("complete #%d with the same token: %q, %v; want ok", i+1, status, err)
		}
	}
	v, err = completeScript.Run(ctx, s.rdb, keys, "token-2", rec, ms(time.Hour), fp, "", "c").Result()
	if status, _, _ := decodeReply(v, err); status != "lost" {
		t.Fatalf("complete with another token: %q, want lost", status)
	}
}

// TestScriptCodecsAgree: the string record codec is copied into each script
// (a script runs on its own, with redis-cli too); the copies must not drift.
func TestScriptCodecsAgree(t *testing.T) {
	codec := func(name, src string) string {
		i := strings.Index(src, "-- record codec")
		j := strings.Index(src, "-- end of record codec")
		if i < 0 || j < i {
			t.Fatalf("%s: no record codec block", name)
		}
		return src[i:j]
	}
	want := codec("claim.lua", scripts.Claim)
	for name, src := range map[string]string{"complete.lua": scripts.Complete, "release.lua": scripts.Release, "inspect.lua": scripts.Inspect} {
		if got := codec(name, src); got != want {
			t.Errorf("%s's record codec differs from claim.lua's:\n%s\nwant\n%s", name, got, want)
		}
	}
}
