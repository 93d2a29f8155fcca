// Command demoupstream is a stand-in for a legacy, non-idempotent API, for
// trying idemproxy by hand (make run starts it when UPSTREAM_URL is unset).
// Every POST creates a new "order" with the next number, so a replay is easy
// to tell from a second execution; every PATCH or PUT counts an update.
//
// Given a command after its flags, it also supervises it, as `make run`
// does with idemproxy:
//
//	demoupstream -addr 127.0.0.1:9000 -- ./bin/idemproxy
//
// It binds its own address first and refuses to start the command when that
// fails, so the proxy never forwards to whatever else holds the port. The
// command runs with UPSTREAM_URL set to the demo, in its own process group:
// SIGINT, SIGTERM and SIGHUP reach demoupstream (from Ctrl-C, or from make,
// which passes SIGTERM on to its recipe) and are forwarded to it once. When
// the command exits, demoupstream exits with its status.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	log.SetPrefix("demoupstream: ")
	log.SetFlags(0)
	addr := flag.String("addr", "127.0.0.1:9000", "listen address (port 0 picks a free one)")
	delay := flag.Duration("delay", 0, "time each POST, PATCH or PUT takes (try 2s to see a 409)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: demoupstream [-addr host:port] [-delay duration] [-- command [args...]]\n\n"+
			"A demo API: POST creates a numbered order (201), PATCH/PUT counts an update (200),\n"+
			"GET shows the counts. With a command, it binds first, then runs the command with\n"+
			"UPSTREAM_URL pointing at itself, and exits when the command does.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Printf("cannot listen on %s: %v", *addr, errors.Unwrap(err))
		log.Fatalf("free that port, or choose another: make run DEMO_UPSTREAM_ADDR=127.0.0.1:9001 (or point UPSTREAM_URL at your own API)")
	}
	srv := &http.Server{Handler: newDemo(*delay), ReadHeaderTimeout: 10 * time.Second}
	url := "http://" + ln.Addr().String()
	log.Printf("demo upstream on %s (POST creates an order, PATCH/PUT counts an update, GET shows the counts; delay %s)", url, *delay)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	if flag.NArg() == 0 {
		log.Fatal(<-served)
	}
	os.Exit(supervise(flag.Args(), url, served))
}

// supervise runs args with UPSTREAM_URL=url and returns the exit status to
// leave with. A child that outlives the demo would answer 502 to everything,
// so if the demo server fails the child is stopped too.
func supervise(args []string, url string, served <-chan error) int {
	// Before the child starts, so no signal falls between.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "UPSTREAM_URL="+url)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own process group: a Ctrl-C reaches only this process, which
	// forwards it once (a second SIGINT would make idemproxy skip its
	// graceful shutdown).
	cmd.SysProcAttr = childAttr()
	if err := startChild(cmd); err != nil {
		log.Printf("cannot start %s: %v", args[0], err)
		return 1
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				sig = syscall.SIGTERM // idemproxy shuts down gracefully on SIGTERM
			}
			_ = cmd.Process.Signal(sig)
		case err := <-served:
			log.Printf("demo upstream stopped: %v; stopping %s", err, args[0])
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
			return 1
		case err := <-exited:
			var ee *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &ee):
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ee.ExitCode()
			default:
				log.Printf("%s: %v", args[0], err)
				return 1
			}
		}
	}
}

// newDemo is the demo API. Its JSON answers are application/json.
func newDemo(delay time.Duration) http.Handler {
	var orders, updates atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		n := orders.Add(1)
		w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
		writeJSON(w, http.StatusCreated, map[string]any{
			"order": n, "path": r.URL.Path, "created_at": time.Now().UTC().Format(time.RFC3339Nano),
		})
	})
	update := func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		n := updates.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{
			"update": n, "method": r.Method, "path": r.URL.Path, "updated_at": time.Now().UTC().Format(time.RFC3339Nano),
		})
	}
	mux.HandleFunc("PATCH /", update)
	mux.HandleFunc("PUT /", update)
	mux.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"orders": orders.Load(), "updates": updates.Load()})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
