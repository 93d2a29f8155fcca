package proxy_test

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// TestReview68RecordingCountsEncodingCapacity: while Redis takes a record,
// what the process holds is the encoding's allocation, cap(enc), not
// len(enc): Record.Encode allocates an over-estimate (10 bytes per header
// value, 20 per name, 43 more) and the allocator rounds it up (to a size
// class, or to whole 8 KiB pages above 32 KiB). The copy the encoding
// replaces was counted by its capacity; the encoding is counted by its
// length. For answers just above 32 KiB that is ~20 % uncounted per
// recording (up to 8 KiB each), more for answers with many short header
// values, which the upstream chooses.
func TestReview68RecordingCountsEncodingCapacity(t *testing.T) {
	const (
		n    = 4
		size = 32<<10 + 1
	)
	for _, backend := range bothBackends {
		t.Run(backend, func(t *testing.T) {
			e := budgetEnv(t, backend, 4<<20, 1<<20, 10*time.Second)
			answerWith(e, bytes.Repeat([]byte("c"), size))
			srv, reg, g := gatedCompletesProxy(t, e, n)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer g.release() // first: the handlers wait for it
			sendDropped(t, &wg, srv, "enccap", n, size)
			lens, caps := g.await(t, n)
			counted := counter(t, reg, "idemproxy_buffered_bytes", nil)
			t.Logf("%d encodings held: len %d, cap %d; idemproxy_buffered_bytes=%v", n, lens, caps, counted)
			if counted < float64(caps) {
				t.Errorf("idemproxy_buffered_bytes %v while %d encodings of %d bytes' capacity (%d long) are held: %d bytes held uncounted", counted, n, caps, lens, caps-int(counted))
			}
			g.release()
			wg.Wait()
			eventually(t, 2*time.Second, "idemproxy_buffered_bytes back to 0", func() bool { return counter(t, reg, "idemproxy_buffered_bytes", nil) == 0 })
		})
	}
}
