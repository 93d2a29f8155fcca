// Command demoupstream is a stand-in for a legacy, non-idempotent API, for
// trying idemproxy by hand (make run starts it when UPSTREAM_URL is unset).
// Every POST creates a new "order" with the next number, so a replay is easy
// to tell from a second execution.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	delay := flag.Duration("delay", 0, "time each POST takes (try 5s to see a 409)")
	flag.Parse()
	var orders atomic.Int64
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(*delay)
		n := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"order": n, "path": r.URL.Path, "created_at": time.Now().UTC().Format(time.RFC3339Nano),
		})
	})
	http.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"orders": orders.Load()})
	})
	log.Printf("demo upstream on http://%s (POST creates an order; delay %s)", *addr, *delay)
	srv := &http.Server{Addr: *addr, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
