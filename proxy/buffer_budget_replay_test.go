package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestBufferBudgetReplaysCounted: a replay holds its record while the client
// reads it (up to UPSTREAM_TIMEOUT per write), so it is counted in
// MAX_BUFFERED_BYTES and refused when there is no room. Eight clients ask for
// replays of 6 MiB records (distinct keys, so the replay cache shares
// nothing; above what the kernel's send buffer takes off the heap) and read
// nothing: the live heap may not grow beyond what idemproxy_buffered_bytes
// counts. Records are in redis-server, not in this process. (Found by
// review: replays were neither counted nor limited in number.)
func TestBufferBudgetReplaysCounted(t *testing.T) {
	const (
		keys   = 8
		max    = 6 << 20 // above what the kernel's send buffer (4 MiB at most) takes off the heap
		budget = 8 << 20
	)
	e := budgetEnv(t, realBackend, budget, max, 10*time.Second)
	big := bytes.Repeat([]byte("r"), max)
	e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		_, _ = w.Write(big)
	})
	for i := range keys {
		if r := e.do(req{key: fmt.Sprintf("replayed-%d", i)}); r.StatusCode != http.StatusOK || len(r.body) != max {
			t.Fatalf("recording %d: status %d, %d bytes", i, r.StatusCode, len(r.body))
		}
	}

	before := liveHeap()
	out, err := redistest.OutputBytes(context.Background(), e.rdb)
	if err != nil {
		t.Fatal(err)
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range keys {
		c, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: replayed-%d\r\nContent-Length: 0\r\n\r\n", i); err != nil {
			t.Fatal(err)
		}
	}
	// Until every replay has read its record and been admitted (it then
	// blocks in its first write, counted) or refused (503, its record
	// dropped). Bounded well within the writes' 10 s deadline (after it the
	// blocked replays end and free their records), so that replays never
	// counted still fail below.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		admitted := int(bufferedBytes(t, e)) / max
		if admitted+int(counter(t, e.reg, "idemproxy_buffer_full_total", nil)) == keys &&
			int(counter(t, e.reg, "idemproxy_inflight_requests", nil)) == admitted {
			break
		}
	}

	// A replay is counted before its record is read (readLarge), so the
	// count says nothing of where it is: each has written its status line
	// once its record is read and decoded, or answered 503.
	for i, c := range conns {
		var line [12]byte // "HTTP/1.1 200", or 503
		if _, err := io.ReadFull(c, line[:]); err != nil {
			t.Fatalf("replay %d: status line: %v", i, err)
		}
	}
	heapWithinCount(t, e, before, "replays of 6 MiB records to clients that do not read", "replays are held in memory, unbounded in number and uncounted")

	// Only the replays let in read their records: a refused one was told
	// the record's size, not sent it (else each held up to a record,
	// uncounted, until it was refused).
	sent, err := redistest.OutputBytes(context.Background(), e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	admitted := int64(bufferedBytes(t, e)) / max
	if refused := counter(t, e.reg, "idemproxy_buffer_full_total", nil); refused == 0 || admitted == 0 {
		t.Fatalf("%v replays refused, %d let in: want some of each, or this shows nothing", refused, admitted)
	}
	if sent -= out; sent > admitted*max+1<<20 {
		t.Errorf("Redis sent %d MiB for %d replays of which %d were let in: the refused ones read their %d MiB records too", sent>>20, keys, admitted, max>>20)
	}
}
