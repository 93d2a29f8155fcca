// Command bareproxy is the reference of the benchmark (scripts/bench.sh): a
// plain httputil.ReverseProxy with the transport and buffer pool idemproxy
// uses, and no idempotency. Ratios in the benchmark table are idemproxy
// divided by this.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "listen address")
	upstream := flag.String("upstream", "", "upstream base URL (required)")
	flag.Parse()

	u, err := url.Parse(*upstream)
	if err != nil || u.Scheme == "" || u.Host == "" {
		fmt.Fprintf(os.Stderr, "bareproxy: -upstream %q: want an absolute URL\n", *upstream)
		os.Exit(2)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport:  proxy.NewTransport(),
		BufferPool: proxy.NewBufferPool(),
		ErrorLog:   log.New(io.Discard, "", 0),
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           rp,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "bareproxy:", err)
		os.Exit(1)
	}
}
