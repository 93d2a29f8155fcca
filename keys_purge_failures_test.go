package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// Each way a purge can fail tells the operator what happened to the record
// and what reaches the replicas' caches now (review 62). Purging again is
// not always safe: a request may have executed and been recorded since.

// TestKeysPurgeOfNothingUnannounced: nothing to delete, and the PUBLISH
// refused: purged:false on stdout, and keys forget named.
func TestKeysPurgeOfNothingUnannounced(t *testing.T) {
	srv := redistest.Start(t)
	nopub := noPublishUser(t, srv)
	hash := strings.TrimSpace(keysOK(t, []string{"REDIS_URL=" + srv.URL()}, "hash", "never-claimed"))
	out, errOut, code := keysRun(t, nopub, "purge", hash)
	if code != 1 || strings.TrimSpace(out) != `{"key_hash":"`+hash+`","purged":false}` || !strings.Contains(errOut, "nothing to delete for "+hash+", and could not announce") ||
		!strings.Contains(errOut, "REDIS_URL=") || !strings.Contains(errOut, "keys forget "+hash+" tells the replicas") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("purge of nothing, announcement refused: exit %d\nstdout %s\nstderr %s\nwant exit 1, purged:false, one line naming the Redis and keys forget", code, out, errOut)
	}
}

// TestKeysPurgeLostReply: the DEL reaches Redis, which runs it, but its
// reply is lost (a network cut; here a relay that drops every reply after
// the DEL). The purge gives up at --timeout; it cannot know whether the
// record is gone, so it says how to find out and what to do either way.
func TestKeysPurgeLostReply(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
	const key = "lostreply"
	first := cachedAnswer(t, c, a, key)
	hash := strings.TrimSpace(keysOK(t, []string{"REDIS_URL=" + srv.URL()}, "hash", key))
	k, err := claim.ParseKeyHash(hash)
	if err != nil {
		t.Fatal(err)
	}
	relay := replyDroppingRelay(t, srv.Addr(), []byte("\r\ndel\r\n"))
	out, errOut, code := keysRun(t, []string{"REDIS_URL=redis://" + relay + "/0"}, "purge", "--timeout", "2s", hash)
	if code != 1 || out != "" {
		t.Fatalf("purge with its reply lost: exit %d, stdout %q; want exit 1 at --timeout, nothing on stdout", code, out)
	}
	if n, _ := srv.Client().Exists(context.Background(), claim.RecordKey("idem:", k)).Result(); n != 0 {
		t.Fatalf("the DEL did not run: this test shows nothing")
	}
	if r := mustPost(t, c, url, key, `{}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" || r.status != http.StatusCreated {
		t.Fatalf("the proxy's cache no longer replays (%d): this test shows nothing", r.status)
	}
	for _, want := range []string{"--timeout=2s", "the delete may have run all the same", "keys get " + hash, "purge again then", "keys forget " + hash + " tells the replicas"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

// TestKeysForgetHeardByNobody: keys forget run with another KEY_PREFIX
// than the proxies' publishes where nobody listens; Redis says 0
// receivers, and the command says so (exit 0: the announcement was made).
func TestKeysForgetHeardByNobody(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "KEY_PREFIX=orders:", "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	hash := strings.TrimSpace(keysOK(t, []string{"REDIS_URL=" + srv.URL(), "KEY_PREFIX=orders:"}, "hash", "nobody"))
	testutil.Eventually(t, 5*time.Second, "the proxy's purge subscription", func() bool {
		n, err := srv.Client().PubSubNumSub(context.Background(), "orders:purge").Result()
		return err == nil && n["orders:purge"] == 1
	})
	out, errOut, code := keysRun(t, []string{"REDIS_URL=" + srv.URL()}, "forget", hash) // KEY_PREFIX left at its default
	if code != 0 || !strings.Contains(out, `"announced":true`) || !strings.Contains(errOut, `no proxy is subscribed to idem:purge on this Redis: check that KEY_PREFIX="idem:"`) {
		t.Errorf("forget under another KEY_PREFIX: exit %d\nstdout %s\nstderr %s\nwant the note that nobody listens, naming KEY_PREFIX", code, out, errOut)
	}
	out, errOut, code = keysRun(t, []string{"REDIS_URL=" + srv.URL(), "KEY_PREFIX=orders:"}, "forget", hash)
	if code != 0 || !strings.Contains(out, `"announced":true`) || errOut != "" {
		t.Errorf("forget under the proxies' KEY_PREFIX: exit %d\nstdout %s\nstderr %s\nwant no note", code, out, errOut)
	}
}

// replyDroppingRelay relays TCP to addr; once a client sends a command
// containing marker (bytes of its RESP form), every later reply to that
// client is dropped, as on a network cut after the request got through.
func replyDroppingRelay(t *testing.T, addr string, marker []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for range 20 { // bounded: the command's connections and retries
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", addr)
			if err != nil {
				_ = cc.Close()
				return
			}
			t.Cleanup(func() { _ = cc.Close(); _ = sc.Close() })
			var cut atomic.Bool
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := cc.Read(buf)
					if n > 0 {
						if bytes.Contains(bytes.ToLower(buf[:n]), marker) {
							cut.Store(true)
						}
						if _, werr := sc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = sc.Close()
						return
					}
				}
			}()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := sc.Read(buf)
					if n > 0 && !cut.Load() {
						if _, werr := cc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = cc.Close()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
