package claim

import (
	"fmt"
	"testing"
	"time"
)

// TestReview83HeldRecordsStayCounted (review 83): a record the cache gave
// out to replay is written without being counted in MAX_BUFFERED_BYTES, to
// a client that may read slowly. Evicted while a replay still writes it,
// it was counted nowhere; so it stays counted in the cache's size until
// its last Release, and the cache keeps within maxBytes with it.
func TestReview83HeldRecordsStayCounted(t *testing.T) {
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
	c.putHeld(NewKey(nil, "a"), fp, a, 0, far, c.generation())
	if !a.Cached || c.held != one {
		t.Fatalf("putHeld: Cached %v, held %d, want %d", a.Cached, c.held, one)
	}
	// Three more replays of it from the cache.
	for range 3 {
		if _, r, _, ok := c.getHeld(NewKey(nil, "a")); !ok || r != a {
			t.Fatal("getHeld missed a")
		}
	}
	// Eight newer records evict it while its four replays are unfinished.
	for i := range 8 {
		c.put(NewKey(nil, fmt.Sprint("fill", i)), fp, newRec(), 0, far, c.generation())
		check(fmt.Sprint("fill ", i))
	}
	if _, _, _, ok := c.get(NewKey(nil, "a")); ok {
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
		c2.putHeld(NewKey(nil, fmt.Sprint("h", i)), fp, r, 0, far, c2.generation())
		held = append(held, r)
	}
	late := newRec()
	c2.putHeld(NewKey(nil, "late"), fp, late, 0, far, c2.generation())
	if late.Cached || c2.size > c2.maxBytes {
		t.Fatalf("a record cached past held records filling the bound: Cached %v, size %d of %d", late.Cached, c2.size, c2.maxBytes)
	}
	held[0].Release()
	again := newRec()
	c2.putHeld(NewKey(nil, "again"), fp, again, 0, far, c2.generation())
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
