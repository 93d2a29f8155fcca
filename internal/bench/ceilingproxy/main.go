// Command ceilingproxy is a minimal two-script design of idemproxy's first
// request, the benchmark's reference for what idemproxy's own features cost
// (issue 14): a bare httputil.ReverseProxy, exactly as
// internal/bench/bareproxy, plus the work of a first request with a new
// Idempotency-Key in a design with one claim script and one complete script:
//
//   - the body read into memory and hashed (the fingerprint), the key hashed;
//   - one claim script before forwarding (Redis TIME, then SET NX GET PX of a
//     small string record with the fencing token, fingerprint and lock
//     deadline: two commands, where idemproxy's claim.lua runs five);
//   - the answer read into memory and encoded (claim.Record.Encode, the
//     product's own encoding);
//   - one complete script before answering (GET, token check, TIME, SET PX:
//     three commands, where complete.lua runs four);
//   - both scripts through go-redis's automatic pipelining with idemproxy's
//     options, each under a 5 s context deadline.
//
// With -redis "" it does all of that but the two scripts (no Redis at all):
// the part of its cost that is not Redis's round trips. With -design
// commands it claims and records with two plain commands instead of the
// scripts: SET NX GET EX of 'i', token and fingerprint (the previous value
// answers a duplicate, or is the request's own claim when go-redis resent
// the SET after losing its reply), then SET EX of the record (go-redis sends
// the 24 h TTL as EX). No clock, no lock deadline (an abandoned claim holds
// its key for the record TTL), no token check on completion: the least any
// design asks of Redis for a first request, a comparison rather than a
// design to ship.
//
// With -design onewrite it keeps the two scripts, which the contract asks
// for (the claim is one EVALSHA; completion checks the claim's token
// atomically in Lua), and has each write once: the claim is one SET NX GET
// PX of the lock TTL (the lock expires with the key, on Redis's clock), the
// completion one GET, the token compared, and one SET PX of the record; a
// completion whose claim expired or was taken over writes nothing and is
// "lost". No TIME, no takeover age, no "late" completion recorded after its
// lock expired: the least a design with the contract's atomic claim and an
// exact fence asks of Redis 7 (which has no conditional SET: the completion
// must read before it writes), one write in each script on every first
// request.
//
// With -design onehash it is onewrite with the record kept as a hash, as
// idemproxy keeps it by default (RECORD_FORMAT=hash): Redis has no
// create-if-absent of a hash with a TTL, so the claim is HSETNX of one
// field (token and fingerprint) and PEXPIRE NX of the lock TTL, the
// completion HGET of that field, the token compared, HSET of the record and
// PEXPIRE of the record TTL. The least such a design asks of Redis for a
// first request: five commands where onewrite runs three.
//
// The scripts design is not the least any design can cost: its scripts read
// TIME to keep a lock deadline and to tell a late completion, as idemproxy
// does (onewrite does neither), and a design that claims with a plain SET NX
// outside a script costs Redis less (-design commands).
//
// It leaves out what no first request of the benchmark needs: no release of
// a claim whose forward failed (the next request takes it over once its
// lock deadline has passed), no routes, scope, limits beyond a 1 MiB body,
// metrics, logs, request ids or problem documents, and no deadlines on the
// client connection. A duplicate is never forwarded: it
// gets the recorded answer (from a map of the answers this process has
// replayed, as idemproxy's replay cache does, else from the claim script's
// reply), or 409.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/bench/leastdesign"
	"github.com/idemproxy/idemproxy/proxy"
)

// claimLua claims KEYS[1] when it is free, or when its lock deadline has
// passed: one TIME and one SET NX GET PX. The value: state 'i', token (16
// bytes), fingerprint (32 bytes), the lock deadline in Redis milliseconds
// and a newline. A key already there is answered with its recorded answer,
// "inflight" or "mismatch".
// ARGV: token, fingerprint, lock ms, record TTL ms.
const claimLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mine = 'i' .. ARGV[1] .. ARGV[2] .. (now + tonumber(ARGV[3])) .. '\n'
local v = redis.call('SET', KEYS[1], mine, 'NX', 'GET', 'PX', ARGV[4])
if not v then
  return {'claimed'}
end
local st = string.sub(v, 1, 1)
if st == 'i' and string.sub(v, 2, 17) == ARGV[1] then
  -- Our own claim: the client resent the script after losing the reply.
  return {'claimed'}
end
if st == 'i' and tonumber(string.sub(v, 50, -2)) <= now then
  redis.call('SET', KEYS[1], mine, 'PX', ARGV[4])
  return {'claimed'}
end
if string.sub(v, 18, 49) ~= ARGV[2] then
  return {'mismatch'}
end
if st == 'c' then
  return {'replay', string.sub(v, string.find(v, '\n', 50, true) + 1)}
end
return {'inflight'}
`

// completeLua records ARGV[2] under the claim of token ARGV[1]: GET, the
// token compared, TIME (lateness is judged on Redis's clock), SET PX.
// ARGV: token, encoded record, record TTL ms.
const completeLua = `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 2, 17) ~= ARGV[1] then
  return 'lost'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], 'c' .. string.sub(v, 2, 49) .. now .. '\n' .. ARGV[2], 'PX', ARGV[3])
if tonumber(string.sub(v, 50, -2)) <= now then
  return 'late'
end
return 'ok'
`

// claimOneLua is -design onewrite's claim: one SET NX GET PX of the lock
// TTL. The value: state 'i' or 'c', token (16 bytes), fingerprint (32
// bytes), then (state 'c') the record. ARGV: token, fingerprint, lock ms.
const claimOneLua = `
local v = redis.call('SET', KEYS[1], 'i' .. ARGV[1] .. ARGV[2], 'NX', 'GET', 'PX', ARGV[3])
if not v then
  return {'claimed'}
end
if string.sub(v, 1, 17) == 'i' .. ARGV[1] then
  return {'claimed'} -- our own claim: the client resent the script after losing the reply
end
if string.sub(v, 18, 49) ~= ARGV[2] then
  return {'mismatch'}
end
if string.sub(v, 1, 1) == 'c' then
  return {'replay', string.sub(v, 50)}
end
return {'inflight'}
`

// completeOneLua is -design onewrite's completion: GET, the token
// compared, SET PX of the record. Nothing is written over another claim's
// value or over an expired claim, so neither its value nor its TTL changes.
// ARGV: token, value ('c', token, fingerprint, record), record TTL ms.
const completeOneLua = `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 2, 17) ~= ARGV[1] then
  return 'lost'
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 'ok'
`

var (
	claimHashScript    = leastdesign.ClaimHash    // -design onehash
	completeHashScript = leastdesign.CompleteHash // -design onehash
	claimScript        = redis.NewScript(claimLua)
	completeScript     = redis.NewScript(completeLua)
	claimOneScript     = redis.NewScript(claimOneLua)
	completeOneScript  = redis.NewScript(completeOneLua)
)

const (
	maxBody   = 1 << 20
	lockTTL   = int64(60_000)         // ms, idemproxy's default LOCK_TTL
	recordTTL = int64(24 * 3_600_000) // ms, idemproxy's default TTL
	redisWait = 5 * time.Second
)

// redisClient sends the scripts, or the commands of -design commands (typed,
// as go-redis's AutoPipeliner batches only those).
type redisClient interface {
	redis.Scripter
	SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd
}

type ceiling struct {
	rp     *httputil.ReverseProxy
	rdb    redisClient // nil: no Redis, the scripts are skipped (-redis "")
	design string      // -design: scripts, onewrite, onehash or commands

	mu       sync.Mutex
	replayed map[[sha256.Size]byte]replayed // by key hash, at most maxReplayed
}

type replayed struct {
	fp  [sha256.Size]byte
	rec *claim.Record
}

const maxReplayed = 10_000

// tokenKey carries a request's claim (record key, token, fingerprint) to
// ModifyResponse.
type tokenKey struct{}

type lease struct {
	key, token string
	fp         [sha256.Size]byte
}

func (c *ceiling) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if r.Method != http.MethodPost || key == "" {
		c.rp.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	fp := sha256.Sum256(body)
	kh := sha256.Sum256([]byte(key))
	c.mu.Lock()
	hit, ok := c.replayed[kh]
	c.mu.Unlock()
	if ok && hit.fp == fp {
		replay(w, hit.rec)
		return
	}
	var hexKey [64]byte
	hex.Encode(hexKey[:], kh[:])
	rk := "idem:{" + string(hexKey[:]) + "}"
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	res := []any{"claimed"}
	if c.rdb != nil {
		ctx, cancel := context.WithTimeout(r.Context(), redisWait)
		res, err = c.claim(ctx, rk, tok[:], fp[:])
		cancel()
	}
	switch {
	case err != nil || len(res) == 0:
		http.Error(w, fmt.Sprintf("claim: %v %v", res, err), http.StatusServiceUnavailable)
		return
	case res[0] == "replay" && len(res) == 2:
		enc, _ := res[1].(string)
		rec, err := claim.DecodeRecord([]byte(enc))
		if err != nil {
			http.Error(w, "record: "+err.Error(), http.StatusInternalServerError)
			return
		}
		c.mu.Lock()
		if len(c.replayed) < maxReplayed {
			c.replayed[kh] = replayed{fp, rec}
		}
		c.mu.Unlock()
		replay(w, rec)
		return
	case res[0] != "claimed":
		http.Error(w, fmt.Sprint(res[0]), http.StatusConflict)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	c.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenKey{}, lease{rk, string(tok[:]), fp})))
}

// claim answers as claimLua does: {"claimed"}, {"replay", record},
// {"inflight"} or {"mismatch"}.
func (c *ceiling) claim(ctx context.Context, rk string, tok, fp []byte) ([]any, error) {
	switch c.design {
	case "scripts":
		return claimScript.Run(ctx, c.rdb, []string{rk}, string(tok), fp, lockTTL, recordTTL).Slice()
	case "onewrite":
		return claimOneScript.Run(ctx, c.rdb, []string{rk}, string(tok), fp, lockTTL).Slice()
	case "onehash":
		return claimHashScript.Run(ctx, c.rdb, []string{rk}, string(tok), fp, lockTTL).Slice()
	}
	v, err := c.rdb.SetArgs(ctx, rk, "i"+string(tok)+string(fp), redis.SetArgs{Mode: "NX", Get: true, TTL: time.Duration(recordTTL) * time.Millisecond}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return []any{"claimed"}, nil
	case err != nil:
		return nil, err
	case len(v) >= 17 && v[0] == 'i' && v[1:17] == string(tok):
		// Our own claim: the client resent the SET after losing its reply.
		return []any{"claimed"}, nil
	case len(v) < 49 || v[17:49] != string(fp):
		return []any{"mismatch"}, nil
	case v[0] == 'c':
		return []any{"replay", v[49:]}, nil
	}
	return []any{"inflight"}, nil
}

// complete records enc under rk as completeLua does, as completeOneLua
// does (-design onewrite), or with a plain SET EX (-design commands: no
// token check, so never "lost").
func (c *ceiling) complete(ctx context.Context, rk string, tok string, fp, enc []byte) (string, error) {
	switch c.design {
	case "scripts":
		return completeScript.Run(ctx, c.rdb, []string{rk}, tok, enc, recordTTL).Text()
	case "onehash":
		return completeHashScript.Run(ctx, c.rdb, []string{rk}, tok, enc, recordTTL).Text()
	}
	v := make([]byte, 0, 49+len(enc))
	v = append(append(append(append(v, 'c'), tok...), fp...), enc...)
	if c.design == "onewrite" {
		return completeOneScript.Run(ctx, c.rdb, []string{rk}, tok, v, recordTTL).Text()
	}
	return "ok", c.rdb.SetArgs(ctx, rk, v, redis.SetArgs{TTL: time.Duration(recordTTL) * time.Millisecond}).Err()
}

func replay(w http.ResponseWriter, rec *claim.Record) {
	h := w.Header()
	for k, v := range rec.Header {
		h[k] = v
	}
	h.Set("Idempotent-Replayed", "true")
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// record reads a keyed answer into memory, records it, and hands it on.
func (c *ceiling) record(resp *http.Response) error {
	l, ok := resp.Request.Context().Value(tokenKey{}).(lease)
	if !ok {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if len(body) > maxBody {
		return errors.New("answer over 1 MiB")
	}
	enc := (&claim.Record{Status: resp.StatusCode, Header: resp.Header, Body: body}).Encode()
	if c.rdb != nil {
		ctx, cancel := context.WithTimeout(resp.Request.Context(), redisWait)
		defer cancel()
		res, err := c.complete(ctx, l.key, l.token, l.fp[:], enc)
		if err != nil {
			return fmt.Errorf("complete: %w", err)
		}
		if res == "lost" {
			return errors.New("complete: claim lost")
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// newCeiling forwards to u and claims in the Redis at redisAddr ("" for
// none) in design (scripts, onewrite, onehash or commands).
func newCeiling(u *url.URL, redisAddr, design string) (*ceiling, error) {
	c := &ceiling{replayed: map[[sha256.Size]byte]replayed{}, design: design}
	if redisAddr != "" {
		// The client as idemproxy makes it from REDIS_URL (redis.go).
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: 1, DialerRetries: 1})
		ap, err := rdb.AutoPipelineWithOptions(claim.AutoPipelineOptions())
		if err != nil {
			return nil, fmt.Errorf("AutoPipeline: %w", err)
		}
		c.rdb = ap
	}
	c.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
			if _, keyed := pr.In.Context().Value(tokenKey{}).(lease); keyed {
				// As idemproxy (proxy/handler.go): the in-memory body unwrapped
				// goes out with the headers in one write.
				pr.Out.Body = pr.In.Body
			}
		},
		Transport:      proxy.NewTransport(),
		BufferPool:     proxy.NewBufferPool(),
		ErrorLog:       log.New(io.Discard, "", 0),
		ModifyResponse: c.record,
	}
	return c, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "listen address")
	upstream := flag.String("upstream", "", "upstream base URL (required)")
	redisAddr := flag.String("redis", "", "redis-server host:port; \"\": no Redis, the scripts are skipped")
	design := flag.String("design", "scripts", "scripts: claim and complete scripts; onewrite: two scripts of one write each (SET NX GET PX; GET, the token checked in Lua, SET PX; no clock); onehash: onewrite with hash records (HSETNX, PEXPIRE NX; HGET, the token checked, HSET, PEXPIRE); commands: a plain SET NX GET EX and a plain SET EX (no lock deadline, no token check)")
	flag.Parse()

	if *design != "scripts" && *design != "onewrite" && *design != "onehash" && *design != "commands" {
		fmt.Fprintf(os.Stderr, "ceilingproxy: -design %q: want scripts, onewrite, onehash or commands\n", *design)
		os.Exit(2)
	}

	u, err := url.Parse(*upstream)
	if err != nil || u.Scheme == "" || u.Host == "" {
		fmt.Fprintf(os.Stderr, "ceilingproxy: -upstream %q: want an absolute URL\n", *upstream)
		os.Exit(2)
	}
	c, err := newCeiling(u, *redisAddr, *design)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceilingproxy:", err)
		os.Exit(1)
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           c,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "ceilingproxy:", err)
		os.Exit(1)
	}
}
