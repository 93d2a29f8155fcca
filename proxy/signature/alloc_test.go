package signature_test

import (
	"encoding/hex"
	"runtime"
	"testing"

	"github.com/idemproxy/idemproxy/proxy/signature"
)

func hexOf(p []byte) string { return hex.EncodeToString(p) }

// Verify must allocate the same small amount whatever the body's size:
// the signed message is written into the HMAC part by part, never
// assembled. Bytes are measured as well as allocations because a copy of
// the body would be a single allocation, and the race detector makes
// allocation counts wobble by one or two.
func TestVerifyDoesNotCopyTheBody(t *testing.T) {
	small := string(make([]byte, 1<<10))
	large := string(make([]byte, 1<<20))
	for _, s := range senders {
		t.Run(s.preset, func(t *testing.T) {
			v := mustNew(t, s.preset, s.secrets[1], s.secrets[0])
			measure := func(body string) (allocs float64, bytes uint64) {
				h := s.deliver(s.secrets[0], nowTS, body)
				b := []byte(body)
				allocs = testing.AllocsPerRun(5, func() {
					if err := v.Verify(h, b, now); err != nil {
						t.Fatalf("got %v, want nil", err)
					}
				})
				const runs = 5
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for range runs {
					_ = v.Verify(h, b, now)
				}
				runtime.ReadMemStats(&after)
				return allocs, (after.TotalAlloc - before.TotalAlloc) / runs
			}
			_, smallBytes := measure(small)
			largeAllocs, largeBytes := measure(large)
			if largeAllocs > 40 {
				t.Errorf("allocations with a 1 MiB body: got %v, want at most 40", largeAllocs)
			}
			if largeBytes > smallBytes+4<<10 {
				t.Errorf("bytes allocated with a 1 MiB body: got %d, want at most %d (as with 1 KiB)", largeBytes, smallBytes+4<<10)
			}
		})
	}
}

// However many candidates a header lists, the work is one HMAC per secret
// over the body. Each HMAC allocates its state, so an HMAC per candidate
// would add several allocations per extra candidate; the slack only
// absorbs the race detector's wobble.
func TestVerifyCandidatesDoNotMultiplyWork(t *testing.T) {
	large := string(make([]byte, 1<<20))
	for _, s := range senders[1:3] {
		t.Run(s.preset, func(t *testing.T) {
			v := mustNew(t, s.preset, s.secrets[0], s.secrets[1])
			bad := s.candidate(s.secrets[2], nowTS, large)
			allocs := func(n int) float64 {
				c := make([]string, n)
				for i := range c {
					c[i] = bad
				}
				h := s.headers(nowTS, c...)
				return testing.AllocsPerRun(5, func() { _ = v.Verify(h, []byte(large), now) })
			}
			if one, full := allocs(1), allocs(signature.MaxSignatures); full > one+4 {
				t.Errorf("allocations with %d candidates: got %v, want at most %v (as with one)", signature.MaxSignatures, full, one+4)
			}
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	body := string(make([]byte, 1<<20))
	for _, s := range senders {
		b.Run(s.preset, func(b *testing.B) {
			v, err := signature.New(s.preset, []string{s.secrets[0]}, tolerance)
			if err != nil {
				b.Fatal(err)
			}
			h := s.deliver(s.secrets[0], nowTS, body)
			p := []byte(body)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := v.Verify(h, p, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
