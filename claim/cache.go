package claim

import (
	"sync"
	"time"
)

// replayCache holds completed records by key, bounded in bytes, oldest
// insertion evicted first. Records in it are shared and must not be
// modified.
//
// A record handed out to replay (get, put) is held until the request
// releases it (Record.Release), and counted in size until then even when it
// leaves the cache: the proxy writes a cached record without counting it in
// MAX_BUFFERED_BYTES, to clients that may read slowly for UPSTREAM_TIMEOUT,
// so the cache's bound must cover it for as long as anything holds it.
type replayCache struct {
	maxBytes int
	maxAge   time.Duration

	mu sync.Mutex
	// size counts the entries in m and those that left it while held; it
	// stays at most maxBytes. held counts the entries held, in m or not.
	size  int
	held  int
	m     map[Key]*cacheEntry
	queue []queued // insertion order, for eviction; may hold entries already gone
	head  int
	stale int // queue slots whose entry was removed
	// gen counts evictions and clears (purges). A put whose Redis read
	// began before one (an older generation) is dropped: its record may
	// be the purged one, read just before the purge and cached after it.
	gen uint64
	// off: the cache neither serves nor keeps anything, while purges are
	// not known to reach it (Store.WatchPurges: no verified subscription).
	off bool
}

type queued struct {
	k Key
	e *cacheEntry
}

type cacheEntry struct {
	fp      Fingerprint
	rec     *Record
	expires time.Time
	size    int
	c       *replayCache
	readers int  // requests holding rec (get, put), until Release
	gone    bool // out of m while held: still counted in size
}

func newReplayCache(maxBytes int, maxAge time.Duration) *replayCache {
	return &replayCache{maxBytes: maxBytes, maxAge: maxAge, m: map[Key]*cacheEntry{}}
}

// get returns k's cached record, with the generation at the lookup, for a
// request that replays it: the request holds it until the record's Release.
func (c *replayCache) get(k Key) (Fingerprint, *Record, uint64, bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || c.off {
		return Fingerprint{}, nil, c.gen, false
	}
	if !now.Before(e.expires) {
		c.remove(k, e)
		return Fingerprint{}, nil, c.gen, false
	}
	c.hold(e)
	return e.fp, e.rec, c.gen, true
}

func (c *replayCache) hold(e *cacheEntry) {
	if e.readers == 0 {
		c.held += e.size
	}
	e.readers++
}

// release ends one hold of e (Record.Release).
func (c *replayCache) release(e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.readers == 0 {
		return // (not held: a second Release of one hold)
	}
	e.readers--
	if e.readers > 0 {
		return
	}
	c.held -= e.size
	if e.gone {
		c.size -= e.size
		e.rec = nil
	}
}

// put caches rec, decoded from an encoding of encodedLen bytes (which its
// body still refers to), until expires (when Redis drops it) or maxAge,
// for the request that read rec and replays it: if rec is cached
// (rec.Cached), that request holds it until rec.Release. gen is the
// generation read before rec was read from Redis: if a purge (evict or
// clear) came since, rec is not cached.
func (c *replayCache) put(k Key, fp Fingerprint, rec *Record, encodedLen int, expires time.Time, gen uint64) {
	size := recordSize(rec, encodedLen)
	if size > c.maxBytes/8 { // one large answer must not flush everything else
		return
	}
	if latest := time.Now().Add(c.maxAge); expires.After(latest) {
		expires = latest
	}
	e := &cacheEntry{fp: fp, rec: rec, expires: expires, size: size, c: c}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen || c.off {
		return // a purge since the read: rec may be what it deleted
	}
	if size > c.maxBytes-c.held {
		// Evicting every entry nobody holds would not make room: the
		// records being written to clients fill the cache's bound.
		return
	}
	if old, ok := c.m[k]; ok {
		c.remove(k, old)
	}
	rec.Cached, rec.pin = true, e
	c.hold(e)
	c.m[k] = e
	c.size += size
	c.queue = append(c.queue, queued{k, e})
	for c.size > c.maxBytes && c.head < len(c.queue) {
		v := c.queue[c.head]
		c.queue[c.head] = queued{}
		c.head++
		if c.m[v.k] == v.e { // not replaced or removed since
			c.remove(v.k, v.e)
		}
		c.stale-- // remove counted it; its slot is gone now
	}
	if c.stale > 1024 && c.stale > len(c.m) { // drop dead slots (and the records they hold)
		live := c.queue[:0:0]
		for _, q := range c.queue[c.head:] {
			if q.e != nil && c.m[q.k] == q.e {
				live = append(live, q)
			}
		}
		c.queue, c.head, c.stale = live, 0, 0
	}
	// Compact the queue once its consumed head dominates it.
	if c.head > 1024 && c.head > len(c.queue)/2 {
		c.queue = append(c.queue[:0:0], c.queue[c.head:]...)
		c.head = 0
	}
}

func (c *replayCache) remove(k Key, e *cacheEntry) {
	delete(c.m, k)
	c.stale++
	if e.readers > 0 {
		e.gone = true // counted until its last release
		return
	}
	c.size -= e.size
	e.rec = nil
}

// recordSize approximates the memory a decoded record holds: the encoded
// bytes its body points into, plus the header strings copied out of them and
// the execution's trace reference (field tr, a string of its own).
func recordSize(r *Record, encodedLen int) int {
	n := 128 + max(encodedLen, len(r.Body)) + len(r.Trace)
	for k, vv := range r.Header {
		n += len(k) + 16
		for _, v := range vv {
			n += len(v) + 16
		}
	}
	return n
}

// evict drops k, if cached (a purge).
func (c *replayCache) evict(k Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if e, ok := c.m[k]; ok {
		c.remove(k, e)
	}
}

// setOff drops every entry (purges may have been missed) and turns the
// cache off (on with false: it serves and keeps records again, from empty).
func (c *replayCache) setOff(off bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	c.off = off
}

func (c *replayCache) isOff() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.off
}

func (c *replayCache) clearLocked() {
	c.gen++
	for k, e := range c.m {
		c.remove(k, e)
	}
	c.queue, c.head, c.stale = nil, 0, 0
}
