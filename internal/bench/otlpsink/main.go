// Command otlpsink is an OTLP/HTTP trace receiver that accepts every export
// and discards it, counting exports and bytes (it decodes nothing): the
// collector end of a tracing-on benchmark (docs/performance.md):
//
//	go run ./internal/bench/otlpsink -listen 127.0.0.1:4318 &
//	scripts/bench.sh -only unique,replay -idem-env OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
//
//	POST /v1/traces  200, an empty ExportTraceServiceResponse (a valid protobuf)
//	GET  /stats      {"exports":N,"bytes":N}
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync/atomic"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4318", "listen address")
	flag.Parse()
	var exports, bytes atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		exports.Add(1)
		bytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty body is an empty ExportTraceServiceResponse
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "{\"exports\":%d,\"bytes\":%d}\n", exports.Load(), bytes.Load())
	})
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("otlpsink listening on", l.Addr())
	log.Fatal(http.Serve(l, mux))
}
