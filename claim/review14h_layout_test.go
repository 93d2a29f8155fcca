package claim_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// review14hEncPrev is a string record as e5bc758 and c44b53c wrote it (the
// same magic 'R1'): each of st, tok, fp, up, at, ld, ct, tr as one length
// byte followed by its bytes, then rec.
func review14hEncPrev(f [8]string, rec string) string {
	var b strings.Builder
	b.WriteString("R1")
	for _, s := range f {
		b.WriteByte(byte(len(s)))
		b.WriteString(s)
	}
	b.WriteString(rec)
	return b.String()
}

// TestReview14hPreviousLayoutUnderSameMagic: 93de227 moved the eight length
// bytes to the front but kept the magic 'R1' of the layout e5bc758 and
// c44b53c wrote (README: "Every version from this one reads both forms"; the
// soak alternates RECORD_FORMAT across restarts). A payment completed by a
// string replica of c44b53c, retried through 93de227 during the rolling
// upgrade, must be replayed, or refused as a record this version cannot
// read: never answered as another request's key (ErrMismatch, a 422 that
// tells the client it reused the key) nor as an upstream mismatch.
func TestReview14hPreviousLayoutUnderSameMagic(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	now := time.Now().UnixMilli()
	want := &claim.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1","amount":100,"note":"` + strings.Repeat("x", 2048) + `"}`)}
	for _, up := range []string{"", "http://payments"} {
		for _, f := range forms {
			t.Run(f.name+"/upstream="+up, func(t *testing.T) {
				prefix := "prev:" + f.name + ":" + up + ":"
				s := claim.NewStore(rdb, prefix, nil, claim.StringRecords(f.str), claim.Upstream(up))
				upHash := ""
				if up != "" {
					// The store's own upstream hash: read it back from a claim.
					k0 := claim.NewKey(nil, "probe")
					if l, _, err := s.Acquire(ctx, k0, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || l == nil {
						t.Fatal(err)
					}
					upHash = recordFields(t, rdb, claim.RecordKey(prefix, k0))["up"]
				}
				k := claim.NewKey(nil, "pay-1")
				fpv := fp("A")
				// The token as newToken makes it: 16 random bytes (fixed here).
				tok := "\x9c\x1f\x04\x7a\xd2\x33\x88\x01\x5e\xe0\x42\x17\xab\x6c\x90\x0d"
				old := review14hEncPrev([8]string{"c", tok, string(fpv[:]), upHash,
					strconv.FormatInt(now-2000, 10), strconv.FormatInt(now+58000, 10), strconv.FormatInt(now-1000, 10), ""},
					string(want.Encode()))
				if err := rdb.Set(ctx, claim.RecordKey(prefix, k), old, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
				l, got, err := s.Acquire(ctx, k, fpv, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				switch {
				case l != nil:
					t.Errorf("the completed payment was claimed again: it executes twice")
				case got != nil:
					t.Logf("replayed %d", got.Status)
				case errors.Is(err, claim.ErrMismatch):
					t.Errorf("retry of the completed payment (c44b53c's string record): %v; want a replay or an error naming an unreadable record, not a fingerprint or upstream mismatch (422)", err)
				default:
					t.Logf("refused: %v", err)
				}
				switch {
				case err == nil && got == nil && l == nil:
					t.Errorf("no answer")
				case err != nil && !errors.Is(err, claim.ErrMismatch) && !strings.Contains(err.Error(), "not a record") && !errors.Is(err, claim.ErrBadRecord):
					t.Errorf("retry of the completed payment (c44b53c's string record): %v", err)
				}
			})
		}
	}
}
