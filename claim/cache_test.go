package claim

import (
	"fmt"
	"testing"
	"time"
)

func TestReplayCacheBoundsAndExpiry(t *testing.T) {
	c := newReplayCache(10_000, time.Hour)
	rec := &Record{Status: 200, Body: make([]byte, 800)} // ~928 bytes accounted
	var fp Fingerprint
	for i := range 50 {
		c.put(NewKey(nil, fmt.Sprint(i)), fp, rec, 0, time.Now().Add(time.Hour))
		if c.size > c.maxBytes {
			t.Fatalf("after %d puts: size %d over the %d limit", i+1, c.size, c.maxBytes)
		}
	}
	if _, _, ok := c.get(NewKey(nil, "0")); ok {
		t.Errorf("oldest entry survived 50 inserts into a 10 kB cache")
	}
	if _, _, ok := c.get(NewKey(nil, "49")); !ok {
		t.Errorf("newest entry evicted")
	}
	// Re-inserting a key must not let its stale queue slot evict the new entry.
	c2 := newReplayCache(8*recordSize(rec, 0), time.Hour)
	a, b, d := NewKey(nil, "a"), NewKey(nil, "b"), NewKey(nil, "d")
	c2.put(a, fp, rec, 0, time.Now().Add(time.Hour))
	c2.put(b, fp, rec, 0, time.Now().Add(time.Hour))
	c2.put(a, fp, rec, 0, time.Now().Add(time.Hour)) // a is now newer than b
	for i := range 7 {                               // the 7th overflows: evicts b, not the new a
		c2.put(NewKey(nil, fmt.Sprint("fill", i)), fp, rec, 0, time.Now().Add(time.Hour))
	}
	if _, _, ok := c2.get(a); !ok {
		t.Errorf("re-inserted entry evicted through its old queue slot")
	}
	if _, _, ok := c2.get(b); ok {
		t.Errorf("oldest entry kept")
	}
	// Expiry: never past the TTL given, nor maxAge.
	c3 := newReplayCache(1<<20, 50*time.Millisecond)
	c3.put(a, fp, rec, 0, time.Now().Add(time.Hour))
	c3.put(b, fp, rec, 0, time.Now().Add(10*time.Millisecond))
	time.Sleep(20 * time.Millisecond)
	if _, _, ok := c3.get(b); ok {
		t.Errorf("entry served past its TTL")
	}
	if _, _, ok := c3.get(a); !ok {
		t.Errorf("entry gone before maxAge")
	}
	time.Sleep(40 * time.Millisecond)
	if _, _, ok := c3.get(a); ok {
		t.Errorf("entry served past maxAge")
	}
	// Huge records are not cached at all.
	c3.put(d, fp, &Record{Status: 200, Body: make([]byte, 1<<20)}, 0, time.Now().Add(time.Hour))
	if _, _, ok := c3.get(d); ok {
		t.Errorf("a record larger than an eighth of the cache was cached")
	}
}
