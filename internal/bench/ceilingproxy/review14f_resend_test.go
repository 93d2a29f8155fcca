package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// dropOnce is a TCP relay on 127.0.0.1 in front of Redis that, the first
// time a client sends a command containing trigger, passes the command on
// to Redis and then, instead of relaying Redis's reply, closes the client's
// connection: the command ran, its reply was lost, as on a network blip.
type dropOnce struct {
	ln      net.Listener
	target  string
	trigger []byte
	fired   atomic.Bool
	dropped atomic.Int64 // replies swallowed
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newDropOnce(t *testing.T, target string, trigger []byte) *dropOnce {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dropOnce{ln: ln, target: target, trigger: trigger}
	d.wg.Add(1)
	go d.accept()
	t.Cleanup(d.close)
	return d
}

func (d *dropOnce) track(c net.Conn) {
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
}

func (d *dropOnce) close() {
	_ = d.ln.Close()
	d.mu.Lock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}

func (d *dropOnce) accept() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", d.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		d.track(c)
		d.track(s)
		var swallow atomic.Bool
		d.wg.Add(2)
		go func() { // client -> Redis
			defer d.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(buf[:n], d.trigger) && d.fired.CompareAndSwap(false, true) {
						swallow.Store(true) // before Redis can answer it
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = s.Close()
					return
				}
			}
		}()
		go func() { // Redis -> client
			defer d.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && swallow.Load() {
					// The triggering command ran in Redis; its reply is lost.
					d.dropped.Add(1)
					_ = c.Close()
					_ = s.Close()
					return
				}
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = c.Close()
					return
				}
			}
		}()
	}
}

// review14f: -design commands claims with SET NX GET and never compares the
// token in the value it gets back. go-redis resends a command whose reply was
// lost (MaxRetries: 1, as idemproxy's client), so a first request whose claim
// reply is lost finds its own claim, calls it "inflight" and is answered 409
// without being forwarded; the key then stays claimed for the record's 24 h
// TTL. idemproxy's claim.lua answers "claimed" to its own token ("the client
// resent the script after losing the reply"); the check costs Redis nothing.
func TestReview14fCommandsResentClaimIsOwnClaim(t *testing.T) {
	t.Run("commands", func(t *testing.T) { testResentClaimIsOwnClaim(t, "commands") })
	// The script designs, with their claim script loaded so that the first
	// EVALSHA runs (and its reply is the one lost).
	t.Run("scripts", func(t *testing.T) { testResentClaimIsOwnClaim(t, "scripts") })
	t.Run("onewrite", func(t *testing.T) { testResentClaimIsOwnClaim(t, "onewrite") })
}

func testResentClaimIsOwnClaim(t *testing.T, design string) {
	srv := redistest.Start(t)
	trigger := []byte("\r\nNX\r\n")
	if design != "commands" {
		script := claimScript
		if design == "onewrite" {
			script = claimOneScript
		}
		rdb := srv.Client()
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := script.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
		trigger = []byte(script.Hash())
	}
	relay := newDropOnce(t, srv.Addr(), trigger)
	f := startFrontAt(t, design, relay.ln.Addr().String())
	code, body, _ := f.post(`{"a":1}`)
	if relay.dropped.Load() != 1 {
		t.Fatalf("the claim's reply was not dropped (dropped %d): the test did not exercise a lost reply", relay.dropped.Load())
	}
	// go-redis resends a command whose reply was lost (MaxRetries: 1): a
	// 503 here means it did not, and the test checks nothing.
	if code == http.StatusServiceUnavailable {
		t.Fatalf("go-redis did not resend the claim (503 %q)", body)
	}
	if code != http.StatusCreated || f.hits.Load() != 1 {
		t.Errorf("first request whose claim reply was lost and resent: status %d %q, upstream hits %d; want 201 and 1 (its own claim, not another's)",
			code, strings.TrimSpace(body), f.hits.Load())
	}
}
