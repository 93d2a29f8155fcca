package claim

import (
	"fmt"
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

func TestReplayCacheBoundsAndExpiry(t *testing.T) {
	c := newReplayCache(10_000, time.Hour)
	rec := &Record{Status: 200, Body: make([]byte, 800)} // ~928 bytes accounted
	var fp Fingerprint
	for i := range 50 {
		c.put(NewKey(nil, fmt.Sprint(i)), fp, rec, 0, time.Now().Add(time.Hour), c.generation())
		if c.size > c.maxBytes {
			t.Fatalf("after %d puts: size %d over the %d limit", i+1, c.size, c.maxBytes)
		}
	}
	if _, _, _, ok := c.get(NewKey(nil, "0")); ok {
		t.Errorf("oldest entry survived 50 inserts into a 10 kB cache")
	}
	if _, _, _, ok := c.get(NewKey(nil, "49")); !ok {
		t.Errorf("newest entry evicted")
	}
	// Re-inserting a key must not let its stale queue slot evict the new entry.
	c2 := newReplayCache(8*recordSize(rec, 0), time.Hour)
	a, b, d := NewKey(nil, "a"), NewKey(nil, "b"), NewKey(nil, "d")
	c2.put(a, fp, rec, 0, time.Now().Add(time.Hour), c2.generation())
	c2.put(b, fp, rec, 0, time.Now().Add(time.Hour), c2.generation())
	c2.put(a, fp, rec, 0, time.Now().Add(time.Hour), c2.generation()) // a is now newer than b
	for i := range 7 {                                                // the 7th overflows: evicts b, not the new a
		c2.put(NewKey(nil, fmt.Sprint("fill", i)), fp, rec, 0, time.Now().Add(time.Hour), c2.generation())
	}
	if _, _, _, ok := c2.get(a); !ok {
		t.Errorf("re-inserted entry evicted through its old queue slot")
	}
	if _, _, _, ok := c2.get(b); ok {
		t.Errorf("oldest entry kept")
	}
	// Expiry: never past the TTL given, nor maxAge.
	c3 := newReplayCache(1<<20, 50*time.Millisecond)
	putAt := time.Now()
	c3.put(a, fp, rec, 0, time.Now().Add(time.Hour), c3.generation())
	c3.put(b, fp, rec, 0, time.Now().Add(10*time.Millisecond), c3.generation())
	time.Sleep(20 * time.Millisecond)
	if _, _, _, ok := c3.get(b); ok {
		t.Errorf("entry served past its TTL")
	}
	// (A loaded machine may have slept past maxAge: then a is rightly gone.)
	if _, _, _, ok := c3.get(a); !ok && time.Since(putAt) < 50*time.Millisecond {
		t.Errorf("entry gone before maxAge")
	}
	time.Sleep(40 * time.Millisecond)
	if _, _, _, ok := c3.get(a); ok {
		t.Errorf("entry served past maxAge")
	}
	// Huge records are not cached at all.
	c3.put(d, fp, &Record{Status: 200, Body: make([]byte, 1<<20)}, 0, time.Now().Add(time.Hour), c3.generation())
	if _, _, _, ok := c3.get(d); ok {
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
		c.put(k, fp, rec, 0, time.Now().Add(time.Hour), gen)
		if _, _, _, ok := c.get(k); ok {
			t.Errorf("%s between the read and the put: the record is cached", name)
		}
		c.put(k, fp, rec, 0, time.Now().Add(time.Hour), c.generation())
		if _, _, _, ok := c.get(k); !ok {
			t.Errorf("%s: a put of the current generation is not cached", name)
		}
	}
}
