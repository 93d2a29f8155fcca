package claim_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// review72CheckString checks that key holds exactly a string record whose
// answer is enc: the head's lengths add up, the answer runs from there to
// the end, and nothing of an earlier value survives.
func review72CheckString(t *testing.T, raw []byte, enc []byte, st string, tr string) {
	t.Helper()
	if len(raw) < 10 || string(raw[:2]) != "R2" {
		t.Fatalf("not a string record: %q", raw[:min(len(raw), 20)])
	}
	p := 10
	var fields [8][]byte
	for i := 0; i < 8; i++ {
		n := int(raw[2+i])
		fields[i] = raw[p : p+n]
		p += n
	}
	if string(fields[0]) != st {
		t.Errorf("st %q, want %q", fields[0], st)
	}
	if string(fields[7]) != tr {
		t.Errorf("tr %q, want %q", fields[7], tr)
	}
	if len(fields[6]) == 0 {
		t.Errorf("no ct")
	}
	if len(raw)-p != len(enc) || !bytes.Equal(raw[p:], enc) {
		t.Errorf("answer in the record: %d bytes (equal: %v), want the %d of the encoding", len(raw)-p, bytes.Equal(raw[p:], enc), len(enc))
	}
}

// TestReview72LargeRecordOverEveryPriorValue: a large answer is written by
// SETRANGE over whatever the key holds. Every value the key can hold when a
// completion reaches setString (our claim in flight, with and without an
// upstream, late; unknown, held by another request or by our own Hold;
// held by a hash replica; lost) leaves an exact record: no byte of the
// earlier value, the completion's TTL, the replay. Both backends.
func TestReview72LargeRecordOverEveryPriorValue(t *testing.T) {
	const trace = "0123456789abcdef0123456789abcdef-0123456789abcdef"
	for _, be := range backends(t) {
		for _, up := range []string{"", "upstream-a"} {
			for _, prior := range []string{"inflight", "late", "held", "ownhold", "hashheld", "lost"} {
				sizes := []int{65537, 300 << 10}
				if up == "" && (prior == "inflight" || prior == "hashheld") {
					sizes = append(sizes, 9<<20)
				}
				for _, size := range sizes {
					name := fmt.Sprintf("%s/up=%q/%s/%d", be.name, up, prior, size)
					t.Run(name, func(t *testing.T) {
						var opts []claim.Option
						opts = append(opts, claim.StringRecords(true))
						if up != "" {
							opts = append(opts, claim.Upstream(up))
						}
						prefix := "r72p:"
						s := claim.NewStore(be.rdb, prefix, nil, opts...)
						k := claim.NewKey(nil, name)
						key := claim.RecordKey(prefix, k)
						terms := claim.Terms{LockTTL: 200 * time.Millisecond, TTL: time.Hour}
						l, _, err := s.Acquire(ctx, k, fp("A"), terms)
						if err != nil || l == nil {
							t.Fatalf("claim: %v", err)
						}
						wantSt := "c"
						switch prior {
						case "late":
							be.advance(t, 300*time.Millisecond)
						case "held":
							be.advance(t, 300*time.Millisecond)
							hold := terms
							hold.Hold = true
							if _, _, err := s.Acquire(ctx, k, fp("A"), hold); err == nil {
								t.Fatalf("hold: no error")
							}
						case "hashheld":
							be.advance(t, 300*time.Millisecond)
							hs := claim.NewStore(be.rdb, prefix, nil, claim.StringRecords(false))
							hold := terms
							hold.Hold = true
							if _, _, err := hs.Acquire(ctx, k, fp("A"), hold); err == nil {
								t.Fatalf("hold: no error")
							}
							if typ := be.rdb.Type(ctx, key).Val(); typ != "hash" {
								t.Fatalf("held by a hash replica: %s", typ)
							}
						case "ownhold":
							if err := l.Hold(ctx, 504, time.Hour); err != nil {
								t.Fatal(err)
							}
						case "lost":
							be.rdb.Del(ctx, key)
						}
						before, _ := be.rdb.Get(ctx, key).Bytes()
						rec := &claim.Record{Status: 201, Header: map[string][]string{"Ct": {"x"}}, Body: bytes.Repeat([]byte{0xff, 0, 'z'}, size/3+1)[:size], Trace: trace}
						enc := rec.Encode()
						if err := l.Complete(ctx, rec, time.Hour); err != nil {
							t.Fatalf("complete: %v", err)
						}
						var raw []byte
						if prior == "hashheld" {
							// A large answer over a hash claim keeps the record a hash.
							h := be.rdb.HGetAll(ctx, key).Val()
							if h["st"] != wantSt || h["rec"] != string(enc) || h["tr"] != trace {
								t.Errorf("hash record: st %q, tr %q, rec of %d bytes; want %q, %q, the answer's %d", h["st"], h["tr"], len(h["rec"]), wantSt, trace, len(enc))
							}
							raw = []byte(h["rec"])
						} else {
							var err error
							if raw, err = be.rdb.Get(ctx, key).Bytes(); err != nil {
								t.Fatal(err)
							}
							review72CheckString(t, raw, enc, wantSt, trace)
						}
						if ttl := be.rdb.PTTL(ctx, key).Val(); ttl < 59*time.Minute || ttl > time.Hour {
							t.Errorf("TTL %v (prior value %d bytes)", ttl, len(before))
						}
						if be.name == "redis-server" {
							slack := int64(200)
							if prior == "hashheld" {
								slack = 2048 // a hash's own structures
							}
							if mu := be.rdb.MemoryUsage(ctx, key, 0).Val(); mu > int64(len(raw))*5/4+slack {
								t.Errorf("memory usage %d for %d bytes", mu, len(raw))
							}
						}
						_, got, err := s.Acquire(ctx, k, fp("A"), terms)
						if err != nil || got == nil || !bytes.Equal(got.Body, rec.Body) || got.Trace != trace {
							t.Errorf("replay: %v %v", got != nil, err)
						}
					})
				}
			}
		}
	}
}
