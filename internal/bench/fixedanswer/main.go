// Command fixedanswer is the least work a net/http server can do for a
// replay, the benchmark's reference for what idemproxy's replay path costs
// on top of net/http (issue 14): it reads each request and its body (at most
// 1 MiB) and answers a fixed 201 of the size and headers of a replay in the
// benchmark, with no Redis, key, fingerprint, deadline on the answer beyond
// the server's, log or metric.
//
// It is configured like idemproxy, so that scripts/bench.sh runs it in
// idemproxy's slot:
//
//	go build -o /tmp/fixedanswer ./internal/bench/fixedanswer
//	scripts/bench.sh -only replay -delays 0 -idem-bin /tmp/fixedanswer [-idem-env SPIN=8us] [-idem-env PPROF_ADDR=127.0.0.1:6061]
//
// LISTEN_ADDR and ADMIN_ADDR as idemproxy's (the admin address answers 200
// to everything, /readyz included). SPIN busy-waits that long in every
// request, to measure the same server at a lower rate. PPROF_ADDR serves
// net/http/pprof there.
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// answerBody is the size of the benchmark upstream's answer.
var answerBody = []byte(`{"id":"ord_0123456789abcdef","object":"order","amount":1000,"currency":"eur","status":"created","customer":"cus_bench","description":"benchmark order","created":1763770077,"livemode":false,"metadata":{}}`)

const maxBody = 1 << 20

// handler answers every request with the fixed replay, after reading its
// body and busy-waiting spin.
func handler(spin time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxBody)); err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if spin > 0 { // no clock reads in the reference itself
			for t := time.Now(); time.Since(t) < spin; {
			}
		}
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Date"] = []string{"Sun, 22 Nov 2026 00:47:57 GMT"}
		h["Idempotency-Key"] = r.Header.Values("Idempotency-Key")
		h["Idempotent-Replayed"] = []string{"true"}
		h["X-Request-Id"] = []string{"d4ij2ocr0g2fk6k0b0ag"}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answerBody)
	})
}

func server(addr string, h http.Handler) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: log.New(io.Discard, "", 0)}
}

func main() {
	var spin time.Duration
	if s := os.Getenv("SPIN"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			fmt.Fprintf(os.Stderr, "fixedanswer: SPIN=%q: want a duration such as 8us\n", s)
			os.Exit(2)
		}
		spin = d
	}
	listen := os.Getenv("LISTEN_ADDR")
	if listen == "" {
		fmt.Fprintln(os.Stderr, "fixedanswer: LISTEN_ADDR is empty")
		os.Exit(2)
	}
	if a := os.Getenv("ADMIN_ADDR"); a != "" {
		go func() { _ = server(a, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ListenAndServe() }()
	}
	if a := os.Getenv("PPROF_ADDR"); a != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go func() {
			s := server(a, mux)
			s.WriteTimeout = 0 // a CPU profile answers after its seconds
			_ = s.ListenAndServe()
		}()
	}
	if err := server(listen, handler(spin)).ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "fixedanswer:", err)
		os.Exit(1)
	}
}
