// Command upstream is the fake legacy API of the benchmark (scripts/bench.sh).
//
//	POST /anything  201, a ~200-byte JSON body, after -delay
//	ANY  /big       200, a body of -big-bytes streamed in 32 KiB writes
//	ANY  /slow      201, the JSON body after -slow (holds the request)
//	GET  /healthz   200
//	GET  /stats     {"hits":N,"conns":N,"inflight":N,"inflight_max":N}; ?reset=1 zeroes hits
//	                and resets inflight_max
//
// /healthz and /stats are not counted as hits.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

type server struct {
	delay    time.Duration
	slow     time.Duration
	bigBytes int64

	seq         atomic.Int64
	hits        atomic.Int64
	conns       atomic.Int64 // connections accepted
	inflight    atomic.Int64
	inflightMax atomic.Int64
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "listen address")
	delay := flag.Duration("delay", 0, "service delay of the default endpoint")
	slow := flag.Duration("slow", 2*time.Second, "service delay of /slow")
	bigBytes := flag.Int64("big-bytes", 10<<20, "body size of /big")
	flag.Parse()

	s := &server{delay: *delay, slow: *slow, bigBytes: *bigBytes}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /stats", s.stats)
	mux.HandleFunc("/big", s.counted(s.big))
	mux.HandleFunc("/slow", s.counted(func(w http.ResponseWriter, r *http.Request) { s.created(w, r, s.slow) }))
	mux.HandleFunc("/", s.counted(func(w http.ResponseWriter, r *http.Request) { s.created(w, r, s.delay) }))

	srv := &http.Server{
		Addr:              *listen,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
	}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "upstream:", err)
		os.Exit(1)
	}
}

func (s *server) counted(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		n := s.inflight.Add(1)
		for {
			m := s.inflightMax.Load()
			if n <= m || s.inflightMax.CompareAndSwap(m, n) {
				break
			}
		}
		defer s.inflight.Add(-1)
		h(w, r)
	}
}

func (s *server) stats(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("reset") != "" {
		s.hits.Store(0)
		s.inflightMax.Store(s.inflight.Load())
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"hits":%d,"conns":%d,"inflight":%d,"inflight_max":%d}`+"\n",
		s.hits.Load(), s.conns.Load(), s.inflight.Load(), s.inflightMax.Load())
}

// created answers 201 with a JSON body of constant size (about 200 bytes).
func (s *server) created(w http.ResponseWriter, r *http.Request, delay time.Duration) {
	io.Copy(io.Discard, r.Body)
	if delay > 0 {
		time.Sleep(delay)
	}
	var buf [256]byte
	b := append(buf[:0], `{"id":"ord_`...)
	b = appendPadded(b, s.seq.Add(1))
	b = append(b, `","object":"order","status":"created","amount":1000,"currency":"eur",`+
		`"customer":"cus_bench","description":"benchmark order","metadata":{"source":"idemproxy-bench"},`+
		`"livemode":false}`...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

func appendPadded(b []byte, n int64) []byte {
	var d [12]byte
	s := strconv.AppendInt(d[:0], n, 10)
	for i := len(s); i < len(d); i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

// big streams bigBytes in 32 KiB writes with a Content-Length, as a file
// download of a legacy API would.
func (s *server) big(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	chunk := make([]byte, 32<<10)
	for i := range chunk {
		chunk[i] = 'a' + byte(i%26)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(s.bigBytes, 10))
	w.WriteHeader(http.StatusOK)
	for left := s.bigBytes; left > 0; {
		n := min(left, int64(len(chunk)))
		if _, err := w.Write(chunk[:n]); err != nil {
			return
		}
		left -= n
	}
}
