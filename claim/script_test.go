package claim

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
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
