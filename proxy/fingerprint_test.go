package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
)

// TestFingerprintAcrossSizes: a body hashed beside the fields and one hashed
// after them by a pooled hasher give the fingerprint of the fields and body
// as one message, on both sides of the boundary and with the path long
// enough to leave the stack buffer; records written by earlier versions keep
// matching, and concurrent hashers do not share a state.
func TestFingerprintAcrossSizes(t *testing.T) {
	t.Parallel()
	paths := []string{"/orders", "/" + strings.Repeat("p", 300)}
	sizes := []int{0, 1, 200, 255, 256, 257, 4096, 4097, 70000}
	for _, path := range paths {
		for _, n := range sizes {
			body := []byte(strings.Repeat("x", n))
			r := httptest.NewRequest("POST", path+"?b=2&a=1", nil)
			strict := sha256.Sum256([]byte("POST\x00" + path + "\x00b=2&a=1\x00" + string(body)))
			if got := fingerprint(r, body, FingerprintStrict); got != strict {
				t.Errorf("strict, path %d bytes, body %d bytes: %x, want %x", len(path), n, got, strict)
			}
			// Not JSON: the body's bytes, after the sorted, length-prefixed query.
			jsonFP := sha256.Sum256([]byte("\x00json\x00POST\x00" + path + "\x00" + "q1:a1:11:b1:2" + "\x00b" + string(body)))
			if got := fingerprint(r, body, FingerprintJSON); got != jsonFP {
				t.Errorf("json, path %d bytes, body %d bytes: %x, want %x", len(path), n, got, jsonFP)
			}
			none := sha256.Sum256([]byte("\x00none\x00POST\x00" + path + "\x00"))
			if got := fingerprint(r, body, FingerprintNone); got != none {
				t.Errorf("none, path %d bytes, body %d bytes: %x, want %x", len(path), n, got, none)
			}
		}
	}

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(strings.Repeat(string(rune('a'+g)), 5000))
			want := sha256.Sum256(append([]byte("POST\x00/c\x00\x00"), body...))
			r := httptest.NewRequest("POST", "/c", nil)
			for range 200 {
				if got := fingerprint(r, body, FingerprintStrict); got != want {
					t.Errorf("goroutine %d: %x, want %x", g, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// refSortedQuery is writeSortedQuery done with url.ParseQuery: what the
// json profile wrote when it built a map of the query.
func refSortedQuery(raw string) string {
	if raw == "" {
		return ""
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "r" + raw
	}
	type kv struct{ k, v string }
	var pairs []kv
	for k, vv := range q {
		for _, v := range vv {
			pairs = append(pairs, kv{k, v})
		}
	}
	slices.SortFunc(pairs, func(a, c kv) int {
		if n := strings.Compare(a.k, c.k); n != 0 {
			return n
		}
		return strings.Compare(a.v, c.v)
	})
	b := []byte{'q'}
	for _, p := range pairs {
		b = fmt.Appendf(b, "%d:%s%d:%s", len(p.k), p.k, len(p.v), p.v)
	}
	return string(b)
}

// TestSortedQueryMatchesParseQuery: the json profile's sorted query, now
// decoded into spans instead of a map, hashes what url.ParseQuery's map
// gave, on awkward and random queries (so fingerprints of records made
// before still match).
func TestSortedQueryMatchesParseQuery(t *testing.T) {
	t.Parallel()
	queries := []string{"", "a=1", "b=2&a=1", "a=2&a=1&a=10", "&&a=1&&", "a", "a=", "=v", "a=%zz", "a=1;b=2", "k%20x=%2B+y",
		"a=1&A=1&a=0", "é=ü&%C3%A9=x", strings.Repeat("z=1&", 3000) + "a=2", "v=" + strings.Repeat("y", 9000) + "&a=" + strings.Repeat("%42", 3000)}
	r := rand.New(rand.NewPCG(3986, 1))
	alphabet := []string{"a", "b", "=", "&", "%2", "%41", "+", "%", ";", "z", "é", ""}
	for range 3000 {
		var sb strings.Builder
		for n := r.IntN(12); n > 0; n-- {
			sb.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		queries = append(queries, sb.String())
	}
	for _, q := range queries {
		var got bytes.Buffer
		writeSortedQuery(&got, q)
		if want := refSortedQuery(q); got.String() != want {
			t.Fatalf("query %q: wrote %q, url.ParseQuery's map gives %q", q, got.String(), want)
		}
	}
}

// TestFingerprintScratchBounds: what fingerprintScratch counts covers what
// fingerprinting allocates, with cold pools, for hostile bodies and queries
// (it is counted in MAX_BUFFERED_BYTES before the work), and is nothing for
// the other profiles. A canonicaliser that built a tree of the body
// allocated about a hundred times the body here.
func TestFingerprintScratchBounds(t *testing.T) {
	for name, tc := range map[string]struct{ body, query string }{
		"empty objects": {"[" + strings.Repeat("{},", 21000) + "{}]", ""},
		"many members":  {"{" + strings.Repeat(`"a":0,"b":1,`, 5000) + `"c":0}`, ""},
		"nested":        {strings.Repeat(`{"a":`, 999) + "0" + strings.Repeat("}", 999), ""},
		"long query":    {`{"a":1}`, strings.Repeat("a=1&b&", 7000)},
		"long value":    {`{"a":1}`, "v=" + strings.Repeat("%41", 20000) + "&k=" + strings.Repeat("x", 30000)},
		"not JSON":      {strings.Repeat("x", 60000), "z=1"},
	} {
		r := httptest.NewRequest("POST", "/x?"+tc.query, nil)
		body := []byte(tc.body)
		bound := fingerprintScratch(r, body, FingerprintJSON)
		runtime.GC()
		runtime.GC() // empties the pools
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fingerprint(r, body, FingerprintJSON)
		runtime.ReadMemStats(&after)
		if used := int64(after.TotalAlloc - before.TotalAlloc); used > bound {
			t.Errorf("%s: fingerprinting allocated %d bytes, over the %d counted", name, used, bound)
		}
		if fingerprintScratch(r, body, FingerprintStrict) != 0 || fingerprintScratch(r, body, FingerprintNone) != 0 {
			t.Errorf("%s: strict and none count scratch", name)
		}
	}
}

// peakHeapOfConcurrentPosts sends n keyed POSTs with body at once through a Handler
// whose ROUTES is spec and whose MAX_BUFFERED_BYTES is the default 32 MiB,
// and returns the largest HeapInuse seen meanwhile and the statuses.
func peakHeapOfConcurrentPosts(t *testing.T, spec, body string, n int) (uint64, map[int]int) {
	t.Helper()
	routes, err := ParseRoutes(spec)
	if err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolSize: n})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := memoryOptions(routes)
	opts.MaxBufferedBytes = 32 << 20 // the default
	opts.Logger = zerolog.New(io.Discard)
	h, err := New(claim.NewStore(rdb, "idem:", nil), opts)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var peak atomic.Uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[int]int{}
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/orders", strings.NewReader(body))
			r.Header.Set("Idempotency-Key", fmt.Sprint("heap-", i))
			w := newRecorder()
			h.ServeHTTP(w, r)
			mu.Lock()
			codes[w.Code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	return peak.Load(), codes
}

// TestJSONFingerprintWithinMemoryBudget: canonicalising keyed JSON bodies
// (fingerprint=json) stays within the memory MAX_BUFFERED_BYTES bounds.
// The canonicaliser used to build a tree of 90 to 100 times the body,
// counted nowhere: 400 concurrent 63 KB keyed requests of "[{},{},...]"
// peaked at 405 to 1,233 MiB of heap (strict: 87 to 122 MiB), enough to get
// a pod at the chart's 256 MiB killed with every claim it held. Now the
// canonical form streams into the hash, and its scratch is counted first.
// HeapInuse counts garbage too, so the same load with strict is the
// yardstick.
func TestJSONFingerprintWithinMemoryBudget(t *testing.T) {
	body := "[" + strings.Repeat("{},", 21000) + "{}]" // 63 KB, under the 64 KiB cap
	const n = 400
	strict, sc := peakHeapOfConcurrentPosts(t, "POST /v1/orders fingerprint=strict", body, n)
	json, jc := peakHeapOfConcurrentPosts(t, "POST /v1/orders fingerprint=json", body, n)
	t.Logf("%d concurrent keyed %d-byte bodies: peak HeapInuse strict %d MiB (%v), json %d MiB (%v)", n, len(body), strict>>20, sc, json>>20, jc)
	// README: about twice MAX_BUFFERED_BYTES + REPLAY_CACHE_BYTES (16 MiB) +
	// 30 MiB, and "the chart's 256Mi limit fits the defaults". HeapInuse
	// counts garbage too, so the same load with strict is the yardstick:
	// json must stay within the chart's limit or twice what strict takes.
	const chartLimit = 256 << 20
	if json > max(chartLimit, 2*strict) {
		t.Errorf("fingerprint=json: peak heap %d MiB with MAX_BUFFERED_BYTES=32 MiB, %.1fx what the same requests take with strict (%d MiB); "+
			"the README sizes the process at about %d MiB and says the chart's 256 MiB limit fits the defaults",
			json>>20, float64(json)/float64(strict), strict>>20, (2*32 + 16 + 30))
	}
}

// TestFingerprintScratchBoundsSmallRequests: fingerprintScratch promises
// to cover everything the json profile allocates, cold pools included, so
// that MAX_BUFFERED_BYTES bounds the heap. The hostile large bodies of
// TestFingerprintScratchBounds are covered; the commonest requests, small
// bodies and short queries, allocate about 1 KB more than is counted (the
// pooled hasher, the tagged writer and the query sorter's own struct are
// not in the sum).
func TestFingerprintScratchBoundsSmallRequests(t *testing.T) {
	for name, tc := range map[string]struct{ body, query string }{
		"small object":            {`{"a":1}`, ""},
		"empty body, short query": {"", "a=1"},
		"small body, short query": {"1", "b=2&a=1"},
	} {
		r := httptest.NewRequest("POST", "/x?"+tc.query, nil)
		body := []byte(tc.body)
		bound := fingerprintScratch(r, body, FingerprintJSON)
		fingerprint(r, body, FingerprintStrict) // package-level one-time initialisation out of the way
		runtime.GC()
		runtime.GC() // empties the pools
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fingerprint(r, body, FingerprintJSON)
		runtime.ReadMemStats(&after)
		if used := int64(after.TotalAlloc - before.TotalAlloc); used > bound {
			t.Errorf("%s: fingerprinting allocated %d bytes, over the %d counted", name, used, bound)
		}
	}
}
