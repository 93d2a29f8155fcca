package claim

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// generation returns the current generation, as get does on a miss: what a
// caller about to read a record from Redis passes to put.
func (c *replayCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// putReleased caches a record like rec under k, as a request that read it
// from Redis does (a record of its own), and releases it as that request's
// replay ends.
func putReleased(c *replayCache, k Key, fp Fingerprint, rec *Record, expires time.Time, gen uint64) {
	r := &Record{Status: rec.Status, Header: rec.Header, Body: rec.Body, Trace: rec.Trace}
	c.put(k, fp, r, 0, expires, gen)
	r.Release()
}

// cached reports whether get finds k, releasing what it held at once, as a
// replay that ends does.
func cached(c *replayCache, k Key) bool {
	_, r, _, ok := c.get(k)
	if ok {
		r.Release()
	}
	return ok
}

func TestReplayCacheBoundsAndExpiry(t *testing.T) {
	c := newReplayCache(10_000, time.Hour)
	rec := &Record{Status: 200, Body: make([]byte, 800)} // ~928 bytes accounted
	var fp Fingerprint
	for i := range 50 {
		putReleased(c, NewKey(nil, fmt.Sprint(i)), fp, rec, time.Now().Add(time.Hour), c.generation())
		if c.size > c.maxBytes {
			t.Fatalf("after %d puts: size %d over the %d limit", i+1, c.size, c.maxBytes)
		}
	}
	if cached(c, NewKey(nil, "0")) {
		t.Errorf("oldest entry survived 50 inserts into a 10 kB cache")
	}
	if !cached(c, NewKey(nil, "49")) {
		t.Errorf("newest entry evicted")
	}
	// Re-inserting a key must not let its stale queue slot evict the new entry.
	c2 := newReplayCache(8*recordSize(rec, 0), time.Hour)
	a, b, d := NewKey(nil, "a"), NewKey(nil, "b"), NewKey(nil, "d")
	putReleased(c2, a, fp, rec, time.Now().Add(time.Hour), c2.generation())
	putReleased(c2, b, fp, rec, time.Now().Add(time.Hour), c2.generation())
	putReleased(c2, a, fp, rec, time.Now().Add(time.Hour), c2.generation()) // a is now newer than b
	for i := range 7 {                                                      // the 7th overflows: evicts b, not the new a
		putReleased(c2, NewKey(nil, fmt.Sprint("fill", i)), fp, rec, time.Now().Add(time.Hour), c2.generation())
	}
	if !cached(c2, a) {
		t.Errorf("re-inserted entry evicted through its old queue slot")
	}
	if cached(c2, b) {
		t.Errorf("oldest entry kept")
	}
	// Expiry: never past the TTL given, nor maxAge.
	c3 := newReplayCache(1<<20, 50*time.Millisecond)
	putAt := time.Now()
	putReleased(c3, a, fp, rec, time.Now().Add(time.Hour), c3.generation())
	putReleased(c3, b, fp, rec, time.Now().Add(10*time.Millisecond), c3.generation())
	time.Sleep(20 * time.Millisecond)
	if cached(c3, b) {
		t.Errorf("entry served past its TTL")
	}
	// (A loaded machine may have slept past maxAge: then a is rightly gone.)
	if !cached(c3, a) && time.Since(putAt) < 50*time.Millisecond {
		t.Errorf("entry gone before maxAge")
	}
	time.Sleep(40 * time.Millisecond)
	if cached(c3, a) {
		t.Errorf("entry served past maxAge")
	}
	// Huge records are not cached at all.
	putReleased(c3, d, fp, &Record{Status: 200, Body: make([]byte, 1<<20)}, time.Now().Add(time.Hour), c3.generation())
	if cached(c3, d) {
		t.Errorf("a record larger than an eighth of the cache was cached")
	}
}

// A put whose read began before an evict or a clear is dropped.
func TestReplayCachePutAfterPurgeDropped(t *testing.T) {
	var fp Fingerprint
	rec := &Record{Status: 200}
	k := NewKey(nil, "k")
	for name, purge := range map[string]func(c *replayCache){
		"evict":       func(c *replayCache) { c.evict(k) },
		"evict other": func(c *replayCache) { c.evict(NewKey(nil, "other")) },
		"clear":       func(c *replayCache) { c.setOff(false) },
	} {
		c := newReplayCache(1<<20, time.Minute)
		gen := c.generation()
		purge(c)
		putReleased(c, k, fp, rec, time.Now().Add(time.Hour), gen)
		if cached(c, k) {
			t.Errorf("%s between the read and the put: the record is cached", name)
		}
		putReleased(c, k, fp, rec, time.Now().Add(time.Hour), c.generation())
		if !cached(c, k) {
			t.Errorf("%s: a put of the current generation is not cached", name)
		}
	}
}

// TestReplayCacheQueueDoesNotLeak: a small working set of hot keys, replayed again
// and again. Each entry expires after maxAge (1 min in production), is removed
// by get, and is put again on the next Redis replay. The removal leaves the
// old queue slot (which still points at the old entry and its record) in the
// queue; the queue is only drained by eviction, which never runs while the
// live size stays below maxBytes. Memory grows without bound although the
// accounted size stays constant.
func TestReplayCacheQueueDoesNotLeak(t *testing.T) {
	c := newReplayCache(16<<20, time.Millisecond) // production: 16 MiB, 1 min
	var fp Fingerprint
	keys := make([]Key, 100)
	for i := range keys {
		keys[i] = NewKey(nil, fmt.Sprint("hot", i))
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const rounds = 200 // = 200 minutes of production traffic on 100 hot keys
	for range rounds {
		for _, k := range keys {
			if !cached(c, k) { // expired: removed, then re-put from Redis
				putReleased(c, k, fp, &Record{Status: 200, Body: make([]byte, 10<<10)}, time.Now().Add(time.Hour), c.generation())
			}
		}
		time.Sleep(2 * time.Millisecond) // let every entry pass maxAge
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("accounted size %d bytes, live entries %d, queue length %d (head %d), heap grew %d MiB",
		c.size, len(c.m), len(c.queue), c.head, grown>>20)
	if len(c.queue)-c.head > 2*len(c.m)+1024 || grown > 4*int64(c.maxBytes) {
		t.Errorf("UNBOUNDED: %d queue slots for %d live entries; heap +%d MiB for a %d MiB cache",
			len(c.queue)-c.head, len(c.m), grown>>20, c.maxBytes>>20)
	}
}

// The replay cache bounds itself with recordSize, which counts the encoded
// record, the body and the headers, but not Record.Trace: with tracing on,
// every cached replay holds 49 more bytes (plus a string header) than
// REPLAY_CACHE_BYTES accounts for.
func TestRecordSizeCountsTrace(t *testing.T) {
	const tr = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	plain := recordSize(&Record{Status: 201, Body: []byte(`{}`)}, 16)
	traced := recordSize(&Record{Status: 201, Body: []byte(`{}`), Trace: tr}, 16)
	if traced < plain+len(tr) {
		t.Errorf("recordSize with a Trace: got %d, want at least %d (%d without, plus the %d-byte trace)", traced, plain+len(tr), plain, len(tr))
	}
}

// TestReplayCacheHeldRecordsStayCounted: a record the cache gave
// out to replay is written without being counted in MAX_BUFFERED_BYTES, to
// a client that may read slowly. Evicted while a replay still writes it,
// it was counted nowhere; so it stays counted in the cache's size until
// its last Release, and the cache keeps within maxBytes with it.
func TestReplayCacheHeldRecordsStayCounted(t *testing.T) {
	var fp Fingerprint
	far := time.Now().Add(time.Hour)
	one := recordSize(&Record{Status: 200, Body: make([]byte, 800)}, 0)
	c := newReplayCache(8*one, time.Hour)
	newRec := func() *Record { return &Record{Status: 200, Body: make([]byte, 800)} }
	check := func(when string) {
		t.Helper()
		if c.size > c.maxBytes || c.held > c.size || c.held < 0 {
			t.Fatalf("%s: size %d, held %d, limit %d", when, c.size, c.held, c.maxBytes)
		}
	}

	// A replay that read the record from Redis and cached it holds it.
	a := newRec()
	c.put(NewKey(nil, "a"), fp, a, 0, far, c.generation())
	if !a.Cached || c.held != one {
		t.Fatalf("put: Cached %v, held %d, want %d", a.Cached, c.held, one)
	}
	// Three more replays of it from the cache.
	for range 3 {
		if _, r, _, ok := c.get(NewKey(nil, "a")); !ok || r != a {
			t.Fatal("get missed a")
		}
	}
	// Eight newer records evict it while its four replays are unfinished.
	for i := range 8 {
		putReleased(c, NewKey(nil, fmt.Sprint("fill", i)), fp, newRec(), far, c.generation())
		check(fmt.Sprint("fill ", i))
	}
	if cached(c, NewKey(nil, "a")) {
		t.Fatal("a still cached after eight newer records in a cache of eight")
	}
	if c.held != one || len(c.m) != 7 {
		t.Fatalf("a evicted while held: held %d (want %d), %d entries (want 7: a's bytes still counted)", c.held, one, len(c.m))
	}
	for i := range 4 {
		a.Release()
		want := one
		if i == 3 {
			want = 0
		}
		if c.held != want {
			t.Fatalf("after %d releases: held %d, want %d", i+1, c.held, want)
		}
	}
	if c.size != 7*one {
		t.Fatalf("after the last release: size %d, want %d", c.size, 7*one)
	}
	a.Release() // one too many: nothing happens
	check("a released once more")

	// While held records fill the bound, nothing more is cached: the
	// caller counts what it reads itself (Cached false).
	c2 := newReplayCache(8*one, time.Hour)
	var held []*Record
	for i := range 8 {
		r := newRec()
		c2.put(NewKey(nil, fmt.Sprint("h", i)), fp, r, 0, far, c2.generation())
		held = append(held, r)
	}
	late := newRec()
	c2.put(NewKey(nil, "late"), fp, late, 0, far, c2.generation())
	if late.Cached || c2.size > c2.maxBytes {
		t.Fatalf("a record cached past held records filling the bound: Cached %v, size %d of %d", late.Cached, c2.size, c2.maxBytes)
	}
	held[0].Release()
	again := newRec()
	c2.put(NewKey(nil, "again"), fp, again, 0, far, c2.generation())
	if !again.Cached || c2.size > c2.maxBytes {
		t.Fatalf("no room made by a release: Cached %v, size %d of %d", again.Cached, c2.size, c2.maxBytes)
	}

	// A purge (clear) of held records keeps them counted until released.
	c2.setOff(false)
	if c2.size != 8*one || len(c2.m) != 0 {
		t.Fatalf("after a clear: size %d (want %d, all still held), %d entries", c2.size, 8*one, len(c2.m))
	}
	for _, r := range append(held[1:], again) {
		r.Release()
	}
	if c2.size != 0 || c2.held != 0 {
		t.Fatalf("all released: size %d, held %d", c2.size, c2.held)
	}
	var none *Record
	none.Release()        // a nil record
	(&Record{}).Release() // one never cached
}
