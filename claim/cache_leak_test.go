package claim

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

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
			if _, _, _, ok := c.get(k); !ok { // expired: removed, then re-put from Redis
				c.put(k, fp, &Record{Status: 200, Body: make([]byte, 10<<10)}, 0, time.Now().Add(time.Hour), c.generation())
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
