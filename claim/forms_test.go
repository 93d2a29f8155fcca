package claim_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// form is a RECORD_FORMAT setting as the tests name it, and the Redis type
// its records have.
type form struct {
	name string
	str  bool
}

func (f form) redisType() string {
	if f.str {
		return "string"
	}
	return "hash"
}

var forms = []form{{"hash", false}, {"string", true}}

// TestRecordFormsInterwork: replicas of either RECORD_FORMAT share one Redis
// during a rollout. Every step of a key's life, begun by a store of one form
// and met by a store of the other, behaves as with one form, and a record
// keeps its form until a store rewrites it whole, in its own form.
func TestRecordFormsInterwork(t *testing.T) {
	t.Parallel()
	for _, be := range backends(t) {
		for _, a := range forms {
			for _, b := range forms {
				t.Run(be.name+"/"+a.name+"_then_"+b.name, func(t *testing.T) {
					prefix := "forms:" + be.name + ":" + a.name + ":" + b.name + ":"
					sa := claim.NewStore(be.rdb, prefix, nil, claim.StringRecords(a.str))
					sb := claim.NewStore(be.rdb, prefix, nil, claim.StringRecords(b.str))
					in := claim.NewInspector(be.rdb, prefix)
					terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
					short := claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour}
					typeOf := func(k claim.Key) string {
						t.Helper()
						typ, err := be.rdb.Type(ctx, claim.RecordKey(prefix, k)).Result()
						if err != nil {
							t.Fatal(err)
						}
						return typ
					}
					want := &claim.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
						Body: []byte("{\"id\":1}\x00\xff R1\x05"), Trace: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}

					// In flight, completed, replayed: a's record as a wrote it.
					k := claim.NewKey(nil, "lifecycle")
					la, _, err := sa.Acquire(ctx, k, fp("A"), terms)
					if err != nil || la == nil {
						t.Fatalf("a claims: %v, %v", la, err)
					}
					if typ := typeOf(k); typ != a.redisType() {
						t.Errorf("a's claim is a Redis %s, want %s", typ, a.redisType())
					}
					if _, _, err := sb.Acquire(ctx, k, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
						t.Errorf("b, same request, while a's is in flight: %v, want ErrInFlight", err)
					}
					if _, _, err := sb.Acquire(ctx, k, fp("B"), terms); !errors.Is(err, claim.ErrMismatch) {
						t.Errorf("b, other request: %v, want ErrMismatch", err)
					}
					if e, err := in.Get(ctx, k); err != nil || e.State != claim.StateInFlight || e.LockExpiresAt.IsZero() || e.ClaimedAt.IsZero() {
						t.Errorf("inspect a's claim: %+v, %v; want in flight with its times", e, err)
					}
					if err := la.Complete(ctx, want, time.Hour); err != nil {
						t.Fatalf("a completes: %v", err)
					}
					if typ := typeOf(k); typ != a.redisType() {
						t.Errorf("a's record is a Redis %s, want %s", typ, a.redisType())
					}
					_, got, err := sb.Acquire(ctx, k, fp("A"), terms)
					if err != nil || got == nil || !reflect.DeepEqual(got, want) {
						t.Fatalf("b replays a's record: %+v, %v; want %+v", got, err, want)
					}
					if _, _, err := sb.Acquire(ctx, k, fp("B"), terms); !errors.Is(err, claim.ErrMismatch) {
						t.Errorf("b, other request, completed: %v, want ErrMismatch", err)
					}
					if e, err := in.Get(ctx, k); err != nil || e.State != claim.StateCompleted || e.Status != 201 ||
						e.Trace != want.Trace || e.Record == nil || string(e.Record.Body) != string(want.Body) || e.CompletedAt.IsZero() {
						t.Errorf("inspect a's record: %+v, %v", e, err)
					}

					// a's claim expires; b takes it over in b's form; a has lost it.
					k = claim.NewKey(nil, "takeover")
					la, _, err = sa.Acquire(ctx, k, fp("A"), short)
					if err != nil || la == nil {
						t.Fatalf("a claims: %v, %v", la, err)
					}
					be.advance(t, 150*time.Millisecond)
					lb, _, err := sb.Acquire(ctx, k, fp("A"), short)
					if err != nil || lb == nil || !lb.TakenOver || lb.TakeoverAge < 100*time.Millisecond {
						t.Fatalf("b takes a's expired claim over: %+v, %v", lb, err)
					}
					if typ := typeOf(k); typ != b.redisType() {
						t.Errorf("b's takeover is a Redis %s, want %s", typ, b.redisType())
					}
					if err := la.Complete(ctx, want, time.Hour); !errors.Is(err, claim.ErrLost) {
						t.Errorf("a completes after the takeover: %v, want ErrLost", err)
					}
					if err := la.Release(ctx); !errors.Is(err, claim.ErrLost) {
						t.Errorf("a releases after the takeover: %v, want ErrLost", err)
					}
					if err := lb.Complete(ctx, &claim.Record{Status: 202}, time.Hour); err != nil {
						t.Fatalf("b completes: %v", err)
					}
					if _, got, err := sa.Acquire(ctx, k, fp("A"), short); err != nil || got == nil || got.Status != 202 {
						t.Errorf("a replays b's record: %+v, %v", got, err)
					}

					// hold: b finds a's lock expired and holds the key as
					// unknown; a's late answer then wins, in a's form.
					k = claim.NewKey(nil, "hold")
					hold := claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour, Hold: true}
					la, _, err = sa.Acquire(ctx, k, fp("A"), hold)
					if err != nil || la == nil {
						t.Fatalf("a claims: %v, %v", la, err)
					}
					claimedAt := recordFields(t, be.rdb, claim.RecordKey(prefix, k))["at"]
					be.advance(t, 150*time.Millisecond)
					var uerr *claim.UnknownError
					if _, _, err := sb.Acquire(ctx, k, fp("A"), hold); !errors.As(err, &uerr) || !uerr.Entered || uerr.Status != 504 {
						t.Fatalf("b finds a's lock expired (hold): %v, want unknown, entered", err)
					}
					f := recordFields(t, be.rdb, claim.RecordKey(prefix, k))
					if typ := typeOf(k); typ != b.redisType() || f["st"] != "u" || f["rec"] != "504" || f["at"] != claimedAt || f["ct"] == "" {
						t.Errorf("held as unknown by b: Redis %s %q; want %s, st u, rec 504, a's at %s, ct", typ, f, b.redisType(), claimedAt)
					}
					if _, _, err := sa.Acquire(ctx, k, fp("A"), hold); !errors.As(err, &uerr) || uerr.Entered || uerr.Status != 504 {
						t.Errorf("a meets the key b held: %v, want unknown 504, not entered", err)
					}
					if err := la.Complete(ctx, want, time.Hour); err != nil || !la.Recreated {
						t.Fatalf("a's late answer: %v (recreated %v), want recorded late", err, la.Recreated)
					}
					if typ := typeOf(k); typ != a.redisType() {
						t.Errorf("a's late record is a Redis %s, want %s", typ, a.redisType())
					}
					if _, got, err := sb.Acquire(ctx, k, fp("A"), hold); err != nil || !reflect.DeepEqual(got, want) {
						t.Errorf("b replays a's late answer: %+v, %v", got, err)
					}

					// hold, then a's answer says nothing ran: a's release frees
					// the key b held, whatever its form.
					k = claim.NewKey(nil, "release")
					la, _, err = sa.Acquire(ctx, k, fp("A"), hold)
					if err != nil || la == nil {
						t.Fatalf("a claims: %v, %v", la, err)
					}
					be.advance(t, 150*time.Millisecond)
					if _, _, err := sb.Acquire(ctx, k, fp("A"), hold); !errors.As(err, &uerr) {
						t.Fatalf("b holds a's expired claim: %v", err)
					}
					if err := la.Release(ctx); err != nil {
						t.Fatalf("a releases the claim b held: %v", err)
					}
					if typ := typeOf(k); typ != "none" {
						t.Errorf("after a's release: a Redis %s, want none", typ)
					}

					// a's claim vanished (a failover, a purge): a's answer is
					// recorded all the same, in a's form.
					k = claim.NewKey(nil, "recreated")
					la, _, err = sa.Acquire(ctx, k, fp("A"), terms)
					if err != nil || la == nil {
						t.Fatalf("a claims: %v, %v", la, err)
					}
					if _, err := in.Purge(ctx, k); err != nil {
						t.Fatal(err)
					}
					if err := la.Complete(ctx, want, time.Hour); err != nil || !la.Recreated {
						t.Fatalf("a completes a purged claim: %v (recreated %v)", err, la.Recreated)
					}
					if typ := typeOf(k); typ != a.redisType() {
						t.Errorf("a's recreated record is a Redis %s, want %s", typ, a.redisType())
					}
					if _, got, err := sb.Acquire(ctx, k, fp("A"), terms); err != nil || !reflect.DeepEqual(got, want) {
						t.Errorf("b replays a's recreated record: %+v, %v", got, err)
					}

					// Another upstream's record is neither replayed nor run.
					ua := claim.NewStore(be.rdb, prefix, nil, claim.StringRecords(a.str), claim.Upstream("http://a"))
					ub := claim.NewStore(be.rdb, prefix, nil, claim.StringRecords(b.str), claim.Upstream("http://b"))
					k = claim.NewKey(nil, "upstream")
					la, _, err = ua.Acquire(ctx, k, fp("A"), terms)
					if err != nil || la == nil {
						t.Fatalf("a claims: %v, %v", la, err)
					}
					if _, _, err := ub.Acquire(ctx, k, fp("A"), terms); !errors.Is(err, claim.ErrOtherUpstream) {
						t.Errorf("b, in front of another upstream, in flight: %v, want ErrOtherUpstream", err)
					}
					if err := la.Complete(ctx, want, time.Hour); err != nil {
						t.Fatal(err)
					}
					if _, _, err := ub.Acquire(ctx, k, fp("A"), terms); !errors.Is(err, claim.ErrOtherUpstream) {
						t.Errorf("b, in front of another upstream, completed: %v, want ErrOtherUpstream", err)
					}
					if e, err := in.Get(ctx, k); err != nil || len(e.Upstream) != 16 {
						t.Errorf("inspect: upstream %q, %v; want the 16-hex hash", e.Upstream, err)
					}
				})
			}
		}
	}
}

// TestRecordFormsForeignString: a string under KEY_PREFIX that is not a
// record is refused by either form, and left as it is: not taken for a free
// key, not overwritten.
func TestRecordFormsForeignString(t *testing.T) {
	t.Parallel()
	for _, be := range backends(t) {
		for _, f := range forms {
			t.Run(be.name+"/"+f.name, func(t *testing.T) {
				prefix := "foreign:" + be.name + ":" + f.name + ":"
				s := claim.NewStore(be.rdb, prefix, nil, claim.StringRecords(f.str))
				for _, v := range []string{"not a record", "R2", "R2\x01i\x10short", "R1\x01\x10\x20\x10\x0d\x0d\x00\x00", ""} {
					k := claim.NewKey(nil, "foreign "+v)
					rk := claim.RecordKey(prefix, k)
					if err := be.rdb.Set(ctx, rk, v, 0).Err(); err != nil {
						t.Fatal(err)
					}
					lease, rec, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
					if err == nil || lease != nil || rec != nil || !strings.Contains(err.Error(), "not a record") {
						t.Errorf("claim over the string %q: %v, %v, %v; want an error naming it not a record", v, lease, rec, err)
					}
					if got, _ := be.rdb.Get(ctx, rk).Result(); got != v {
						t.Errorf("the string %q became %q", v, got)
					}
				}
			})
		}
	}
}

// TestRecordFormsCommands: what a first request asks of Redis, command by
// command, in each form (the scripts' commands as Redis counts them).
func TestRecordFormsCommands(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	for _, tc := range []struct {
		f    form
		want map[string]int64
	}{
		{forms[0], map[string]int64{"hsetnx": 1, "hmget": 1, "time": 2, "hset": 2, "pexpire": 2}},
		{forms[1], map[string]int64{"time": 2, "set": 2, "get": 1}},
	} {
		t.Run(tc.f.name, func(t *testing.T) {
			s := claim.NewStore(rdb, "cmds:", nil, claim.StringRecords(tc.f.str))
			k := claim.NewKey(nil, "count "+tc.f.name)
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			lease, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || lease == nil {
				t.Fatalf("claim: %v, %v", lease, err)
			}
			if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("ok")}, time.Hour); err != nil {
				t.Fatal(err)
			}
			info, err := rdb.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			got := commandStats(t, info)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("commands of one first request: %v, want %v", got, tc.want)
			}
		})
	}
}

// commandStats is INFO commandstats as name -> calls, the client's and the
// tests' own commands (EVALSHA, CONFIG, INFO...) left out: what the scripts
// ran.
func commandStats(t *testing.T, info string) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(strings.TrimPrefix(name, "cmdstat_"), "|")
		switch name {
		case "evalsha", "eval", "config", "info", "script", "ping", "hello", "client":
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats line %q: %v", line, err)
		}
		got[name] = n
	}
	return got
}

// TestRecordFormsLargeAnswer: an answer above the size a string record
// concatenates inside Lua (64 KiB; larger ones are appended) is kept and
// replayed byte for byte in both forms, read by both, by an operator too.
func TestRecordFormsLargeAnswer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	for _, size := range []int{65536 - 300, 65536 + 1, 300 << 10} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i*7 + i>>8)
		}
		want := &claim.Record{Status: 200, Header: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: body,
			Trace: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}
		for _, a := range forms {
			t.Run(fmt.Sprintf("%d/%s", size, a.name), func(t *testing.T) {
				prefix := fmt.Sprintf("large:%d:%s:", size, a.name)
				sa := claim.NewStore(rdb, prefix, nil, claim.StringRecords(a.str))
				k := claim.NewKey(nil, "large")
				lease, _, err := sa.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				if err != nil || lease == nil {
					t.Fatalf("claim: %v, %v", lease, err)
				}
				if err := lease.Complete(ctx, want, time.Hour); err != nil {
					t.Fatal(err)
				}
				if ttl := rdb.PTTL(ctx, claim.RecordKey(prefix, k)).Val(); ttl < 59*time.Minute {
					t.Errorf("TTL %v, want the hour", ttl)
				}
				for _, b := range forms {
					sb := claim.NewStore(rdb, prefix, nil, claim.StringRecords(b.str))
					if _, got, err := sb.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || !reflect.DeepEqual(got, want) {
						t.Errorf("%s store replays: %v, equal %v", b.name, err, reflect.DeepEqual(got, want))
					}
				}
				e, err := claim.NewInspector(rdb, prefix).Get(ctx, k)
				if err != nil || e.Record == nil || !bytes.Equal(e.Record.Body, body) || e.StringForm != a.str {
					t.Errorf("inspect: %v, body equal %v, string form %v", err, e != nil && e.Record != nil && bytes.Equal(e.Record.Body, body), e != nil && e.StringForm)
				}
			})
		}
	}
}

// TestLongTraceRecordedInBothForms: the string codec keeps each
// field but rec behind one length byte (string.char(#s) in enc), so a field
// of 256 bytes or more makes the script fail. Record.Trace is a free string
// of the public API (the proxy writes 49 bytes, a library user may write a
// W3C traceparent with tracestate, or anything): in hash form it is stored,
// in string form Complete fails after its ~5 s of retries and the answer is
// lost (the key stays in flight until its lock expires: then executed again,
// or held unknown). The form must not change what can be recorded.
func TestLongTraceRecordedInBothForms(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tr := strings.Repeat("a", 256)
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			s := claim.NewStore(rdb, "trace256:"+f.name+":", nil, claim.StringRecords(f.str))
			k := claim.NewKey(nil, "long trace")
			lease, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || lease == nil {
				t.Fatalf("claim: %v, %v", lease, err)
			}
			start := time.Now()
			if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("ok"), Trace: tr}, time.Hour); err != nil {
				t.Fatalf("Complete with a %d-byte Trace (%s records): %v (after %v)", len(tr), f.name, err, time.Since(start).Round(time.Millisecond))
			}
			// Recorded in both forms; a Trace that is not a trace context
			// ("<trace-id>-<span-id>", Record.Trace) is dropped in both.
			if _, rec, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || rec == nil || string(rec.Body) != "ok" || rec.Trace != "" {
				t.Errorf("replay: %+v, %v; want the answer, without the trace", rec, err)
			}
		})
	}
}

// formsWorld is one Redis (miniredis, virtual clock) with replicas
// sharing it.
type formsWorld struct {
	mr     *miniredis.Miniredis
	rdb    *redis.Client
	stores []*claim.Store
	in     *claim.Inspector
	leases map[int]*claim.Lease
	virt   time.Time
}

func describeErr(err error) string {
	var u *claim.UnknownError
	switch {
	case err == nil:
		return "nil"
	case errors.As(err, &u):
		return fmt.Sprintf("unknown(%d,%v)", u.Status, u.Entered)
	case errors.Is(err, claim.ErrOtherUpstream):
		return "otherupstream"
	case errors.Is(err, claim.ErrMismatch):
		return "mismatch"
	case errors.Is(err, claim.ErrInFlight):
		return "inflight"
	case errors.Is(err, claim.ErrLost):
		return "lost"
	case errors.Is(err, claim.ErrNotFound):
		return "notfound"
	case errors.Is(err, claim.ErrBadRecord):
		return "badrecord"
	}
	return "error:" + err.Error()
}

// TestRecordFormsDifferential (passes: evidence, not a finding): random
// lives of two keys (claims by four replicas with random upstreams, hold or
// expire, completions with and without trace, holds, releases, time passing
// past locks and TTLs, purges, pre-upgrade claim marks, inspection) run
// twice: once with every replica writing hashes, once with each replica's
// RECORD_FORMAT drawn at random. Every step must answer the same in both
// worlds (status, replayed bytes and trace, takeover age, Recreated,
// AlreadyUnknown, what keys get reads, TTLs). R14G_SEEDS raises the number
// of lives (default 60).
func TestRecordFormsDifferential(t *testing.T) {
	t.Parallel()
	seeds := 60
	if n, err := strconv.Atoi(os.Getenv("R14G_SEEDS")); err == nil && n > 0 {
		seeds = n
	}
	const nStores, steps = 4, 60
	trace := "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	for seed := 1; seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(int64(seed)))
		strs := make([]bool, nStores)
		ups := make([]string, nStores)
		for i := range strs {
			strs[i] = rng.Intn(2) == 0
			if rng.Intn(4) == 0 {
				ups[i] = "u" + strconv.Itoa(rng.Intn(2))
			}
		}
		world := func(mixed bool) *formsWorld {
			mr := miniredis.RunT(t)
			w := &formsWorld{mr: mr, rdb: redis.NewClient(&redis.Options{Addr: mr.Addr()}), leases: map[int]*claim.Lease{}}
			t.Cleanup(func() { _ = w.rdb.Close() })
			w.virt = time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
			mr.SetTime(w.virt)
			for i := range nStores {
				w.stores = append(w.stores, claim.NewStore(w.rdb, "d:", nil, claim.StringRecords(mixed && strs[i]), claim.Upstream(ups[i])))
			}
			w.in = claim.NewInspector(w.rdb, "d:")
			return w
		}
		worlds := [2]*formsWorld{world(false), world(true)}
		keys := []claim.Key{claim.NewKey(nil, "k0"), claim.NewKey(nil, "k1")}
		nextLease := 0
		var log []string
		for step := range steps {
			// Every random choice is drawn here, once for both worlds.
			op, si, ki := rng.Intn(9), rng.Intn(nStores), rng.Intn(len(keys))
			k := keys[ki]
			terms := claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Duration(1+rng.Intn(3)) * time.Second, Hold: rng.Intn(2) == 0}
			f := fp([]string{"A", "B"}[rng.Intn(4)/3])
			adv := time.Duration(rng.Intn(3)) * 60 * time.Millisecond
			var lids []int
			for id := range worlds[0].leases {
				lids = append(lids, id)
			}
			slices.Sort(lids)
			lid, lop, tr := -1, rng.Intn(4), ""
			if len(lids) > 0 {
				lid = lids[rng.Intn(len(lids))]
			}
			if rng.Intn(2) == 0 {
				tr = trace
			}
			ttl := time.Duration(1+rng.Intn(3)) * time.Second
			var got [2]string
			for wi, w := range worlds {
				switch op {
				case 0, 1, 2:
					l, r, err := w.stores[si].Acquire(ctx, k, f, terms)
					s := fmt.Sprintf("acquire s%d k%d %x hold=%v: ", si, ki, f[0], terms.Hold)
					if l != nil {
						w.leases[nextLease] = l
						s += fmt.Sprintf("lease%d takeover=%v age=%v ", nextLease, l.TakenOver, l.TakeoverAge)
					}
					if r != nil {
						s += fmt.Sprintf("rec %d %q %q ", r.Status, r.Body, r.Trace)
					}
					got[wi] = s + describeErr(err)
				case 3, 4:
					if lid < 0 {
						got[wi] = "no lease"
						break
					}
					l := w.leases[lid]
					var err error
					switch lop {
					case 0, 1:
						err = l.Complete(ctx, &claim.Record{Status: 201, Body: []byte(fmt.Sprint("body", step)), Trace: tr}, ttl)
					case 2:
						err = l.Hold(ctx, 502, ttl)
					case 3:
						err = l.Release(ctx)
					}
					got[wi] = fmt.Sprintf("lease%d op%d: %s recreated=%v already=%v", lid, lop, describeErr(err), l.Recreated, l.AlreadyUnknown)
				case 5:
					w.virt = w.virt.Add(adv)
					w.mr.SetTime(w.virt)
					w.mr.FastForward(adv)
					got[wi] = fmt.Sprint("advance ", adv)
				case 6:
					e, err := w.in.Get(ctx, k)
					if e == nil {
						got[wi] = "get " + describeErr(err)
						break
					}
					got[wi] = fmt.Sprintf("get k%d %s %d at=%v ct=%v ld=%v ttl=%v up=%q tr=%q %s", ki, e.State, e.Status,
						e.ClaimedAt, e.CompletedAt, e.LockExpiresAt, e.TTL, e.Upstream, e.Trace, describeErr(err))
				case 7:
					ok, err := w.in.Purge(ctx, k)
					got[wi] = fmt.Sprintf("purge k%d %v %s", ki, ok, describeErr(err))
				case 8:
					rk := claim.RecordKey("d:", k)
					err := w.rdb.Set(ctx, rk+":m", strconv.FormatInt(w.virt.UnixMilli()-50, 10), time.Hour).Err()
					got[wi] = "mark " + describeErr(err)
				}
			}
			if op <= 2 {
				nextLease++
			}
			log = append(log, got[0])
			if got[0] != got[1] {
				t.Fatalf("seed %d step %d: all-hash world %q, mixed world (string replicas %v) %q\nsteps:\n%s",
					seed, step, got[0], strs, got[1], strings.Join(log, "\n"))
			}
		}
	}
}

// TestRecordFormsResend (passes: evidence, not a finding): go-redis
// resends a script whose reply was lost. For every state a key can be in
// (none, in flight, lock expired, completed, unknown),
// hold or not, each record form and each writer form: the claim run twice
// with one token, then completed with it, answers as with hashes only (the
// second run recognises its own token; a completion after it is ok or lost
// alike).
func TestRecordFormsResend(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	cs := redis.NewScript(scripts.Claim)
	comp := redis.NewScript(scripts.Complete)
	n := 0
	type result struct{ first, second, third string }
	res := map[string]map[string]result{}
	for _, state := range []string{"none", "live", "expired", "c", "u"} {
		for _, hold := range []string{"", "1"} {
			for _, recForm := range []string{"", "s"} {
				for _, wForm := range []string{"", "s"} {
					n++
					rk := fmt.Sprintf("rs:{%d}", n)
					fpv := string(make([]byte, 32))
					// set up with the claim script in recForm
					switch state {
					case "live", "expired", "c", "u":
						lock := 60000
						if state == "expired" {
							lock = 1
						}
						if _, err := cs.Run(ctx, rdb, []string{rk}, "orig", fpv, lock, 3600000, "", "", recForm).Result(); err != nil {
							t.Fatal(err)
						}
						if state == "c" || state == "u" {
							st := map[string]string{"c": "c", "u": "u"}[state]
							if _, err := comp.Run(ctx, rdb, []string{rk}, "orig", "REC", 3600000, fpv, "", st, "", recForm).Result(); err != nil {
								t.Fatal(err)
							}
						}
					}
					time.Sleep(5 * time.Millisecond)
					r1, e1 := cs.Run(ctx, rdb, []string{rk}, "me", fpv, 60000, 3600000, "", hold, wForm).Result()
					r2, e2 := cs.Run(ctx, rdb, []string{rk}, "me", fpv, 60000, 3600000, "", hold, wForm).Result()
					r3, e3 := comp.Run(ctx, rdb, []string{rk}, "me", "MINE", 3600000, fpv, "", "c", "", wForm).Result()
					age := func(v any) string {
						s := fmt.Sprint(v)
						if a, ok := v.([]any); ok && len(a) > 1 && (a[0] == "takeover" || a[0] == "replay") {
							s = fmt.Sprint(a[0])
						}
						return s
					}
					r := result{age(r1) + fmt.Sprint(e1), age(r2) + fmt.Sprint(e2), age(r3) + fmt.Sprint(e3)}
					key := state + "/hold=" + hold
					if res[key] == nil {
						res[key] = map[string]result{}
					}
					res[key]["rec"+recForm+"/w"+wForm] = r
				}
			}
		}
	}
	for k, m := range res {
		ref := m["rec/w"]
		for f, r := range m {
			if r != ref {
				t.Errorf("%s %s: %v vs hash-only %v", k, f, r, ref)
			}
		}
	}
}

// TestStringStoreReadsHashRecordWithoutWriting: with
// RECORD_FORMAT=string, claim.lua reads the record with MGET, and when MGET
// finds no string it tries SET NX before it looks for a hash. A hash record
// (every record written before the switch, and by any hash replica during
// the rollout, for one TTL after) is therefore only read after a write
// command. Redis refuses a script's first write, before it looks at the
// key, when it refuses writes at all: min-replicas-to-write not met
// (NOREPLICAS), out of memory under noeviction (OOM), a demoted master
// (READONLY), a failed save (MISCONF). A hash replica replays the recorded
// answer (its claim only reads); a string replica gets an error, and
// NOREPLICAS/READONLY count as an outage (claim.Unavailable): with
// FAIL_MODE=open the completed key is forwarded and executes again.
func TestStringStoreReadsHashRecordWithoutWriting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		cfg, reset [2]string
	}{
		{"min-replicas-to-write (NOREPLICAS)", [2]string{"min-replicas-to-write", "1"}, [2]string{"min-replicas-to-write", "0"}},
		{"maxmemory under noeviction (OOM)", [2]string{"maxmemory", "1"}, [2]string{"maxmemory", "0"}},
		{"a demoted master (READONLY)", [2]string{"REPLICAOF", ""}, [2]string{"REPLICAOF", "NO ONE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, "maxmemory-policy noeviction")
			rdb := srv.Client()
			hash := claim.NewStore(rdb, "wf:", nil, claim.StringRecords(false))
			str := claim.NewStore(rdb, "wf:", nil, claim.StringRecords(true))
			terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}

			// A payment recorded by a hash replica, another still in flight.
			done := claim.NewKey(nil, "paid")
			l, _, err := hash.Acquire(ctx, done, fp("A"), terms)
			if err != nil || l == nil {
				t.Fatalf("hash replica claims: %v, %v", l, err)
			}
			if err := l.Complete(ctx, &claim.Record{Status: 201, Body: []byte("paid once")}, time.Hour); err != nil {
				t.Fatal(err)
			}
			busy := claim.NewKey(nil, "busy")
			if l, _, err := hash.Acquire(ctx, busy, fp("A"), terms); err != nil || l == nil {
				t.Fatalf("hash replica claims: %v, %v", l, err)
			}

			if tc.cfg[0] == "REPLICAOF" {
				// Its master is a port nobody listens on: it keeps its
				// data (no sync happens) and refuses writes, as an old
				// master does after a failover until it resyncs.
				if err := rdb.Do(ctx, "REPLICAOF", "127.0.0.1", redistest.FreePort(t)).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err() })
			} else {
				if err := rdb.ConfigSet(ctx, tc.cfg[0], tc.cfg[1]).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rdb.ConfigSet(ctx, tc.reset[0], tc.reset[1]).Err() })
			}

			// Control: the hash replica still answers from the record.
			if _, rec, err := hash.Acquire(ctx, done, fp("A"), terms); err != nil || rec == nil || string(rec.Body) != "paid once" {
				t.Fatalf("control, hash replica: %v, %v; want the replay", rec, err)
			}
			if _, _, err := hash.Acquire(ctx, busy, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
				t.Fatalf("control, hash replica on the in-flight key: %v, want ErrInFlight", err)
			}

			_, rec, err := str.Acquire(ctx, done, fp("A"), terms)
			if err != nil || rec == nil || string(rec.Body) != "paid once" {
				t.Errorf("string replica, completed hash record: record %v, err %v (claim.Unavailable=%v; true means FAIL_MODE=open forwards the completed key again); want the replay the hash replica gives",
					rec, err, claim.Unavailable(err))
			}
			_, _, err = str.Acquire(ctx, busy, fp("A"), terms)
			if !errors.Is(err, claim.ErrInFlight) {
				t.Errorf("string replica, in-flight hash record: %v (claim.Unavailable=%v); want ErrInFlight as the hash replica answers",
					err, claim.Unavailable(err))
			}
		})
	}
}

// encPrevLayout is a string record as e5bc758 and c44b53c wrote it (the
// same magic 'R1'): each of st, tok, fp, up, at, ld, ct, tr as one length
// byte followed by its bytes, then rec.
func encPrevLayout(f [8]string, rec string) string {
	var b strings.Builder
	b.WriteString("R1")
	for _, s := range f {
		b.WriteByte(byte(len(s)))
		b.WriteString(s)
	}
	b.WriteString(rec)
	return b.String()
}

// TestStringRecordPreviousLayoutUnderSameMagic: 93de227 moved the eight length
// bytes to the front but kept the magic 'R1' of the layout e5bc758 and
// c44b53c wrote (README: "Every version from this one reads both forms"; the
// soak alternates RECORD_FORMAT across restarts). A payment completed by a
// string replica of c44b53c, retried through 93de227 during the rolling
// upgrade, must be replayed, or refused as a record this version cannot
// read: never answered as another request's key (ErrMismatch, a 422 that
// tells the client it reused the key) nor as an upstream mismatch.
func TestStringRecordPreviousLayoutUnderSameMagic(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	now := time.Now().UnixMilli()
	want := &claim.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1","amount":100,"note":"` + strings.Repeat("x", 2048) + `"}`)}
	for _, up := range []string{"", "http://payments"} {
		for _, f := range forms {
			t.Run(f.name+"/upstream="+up, func(t *testing.T) {
				prefix := "prev:" + f.name + ":" + up + ":"
				s := claim.NewStore(rdb, prefix, nil, claim.StringRecords(f.str), claim.Upstream(up))
				upHash := ""
				if up != "" {
					// The store's own upstream hash: read it back from a claim.
					k0 := claim.NewKey(nil, "probe")
					if l, _, err := s.Acquire(ctx, k0, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || l == nil {
						t.Fatal(err)
					}
					upHash = recordFields(t, rdb, claim.RecordKey(prefix, k0))["up"]
				}
				k := claim.NewKey(nil, "pay-1")
				fpv := fp("A")
				// The token as newToken makes it: 16 random bytes (fixed here).
				tok := "\x9c\x1f\x04\x7a\xd2\x33\x88\x01\x5e\xe0\x42\x17\xab\x6c\x90\x0d"
				old := encPrevLayout([8]string{"c", tok, string(fpv[:]), upHash,
					strconv.FormatInt(now-2000, 10), strconv.FormatInt(now+58000, 10), strconv.FormatInt(now-1000, 10), ""},
					string(want.Encode()))
				if err := rdb.Set(ctx, claim.RecordKey(prefix, k), old, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
				l, got, err := s.Acquire(ctx, k, fpv, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				switch {
				case l != nil:
					t.Errorf("the completed payment was claimed again: it executes twice")
				case got != nil:
					t.Logf("replayed %d", got.Status)
				case errors.Is(err, claim.ErrMismatch):
					t.Errorf("retry of the completed payment (c44b53c's string record): %v; want a replay or an error naming an unreadable record, not a fingerprint or upstream mismatch (422)", err)
				default:
					t.Logf("refused: %v", err)
				}
				switch {
				case err == nil && got == nil && l == nil:
					t.Errorf("no answer")
				case err != nil && !errors.Is(err, claim.ErrMismatch) && !strings.Contains(err.Error(), "not a record") && !errors.Is(err, claim.ErrBadRecord):
					t.Errorf("retry of the completed payment (c44b53c's string record): %v", err)
				}
			})
		}
	}
}

// TestStringClaimRefusedWrite (passes: evidence, not a finding):
// claim.lua's pcall'd SET NX, refused by a Redis that answers (NOREPLICAS
// under min-replicas-to-write, READONLY on a demoted master, OOM under
// noeviction), over no record or a foreign hash without st. The refusal is
// reported (no lease, no replay), classified by claim.Unavailable as the hash
// form's is (NOREPLICAS and READONLY an outage, OOM not), and nothing is
// written or deleted: the foreign hash stays a hash. Over a completed record
// the refused SET NX (the fast path writes first) does not stand: the record
// is read and replayed, as a Redis that refuses writes still answers reads.
func TestStringClaimRefusedWrite(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	for _, tc := range []struct {
		name          string
		unavailable   bool
		refuse, allow func() error
	}{
		{"NOREPLICAS", true,
			func() error { return rdb.ConfigSet(ctx, "min-replicas-to-write", "1").Err() },
			func() error { return rdb.ConfigSet(ctx, "min-replicas-to-write", "0").Err() }},
		{"READONLY", true,
			// Its master is a port nobody listens on: it keeps its data, refuses writes.
			func() error { return rdb.Do(ctx, "REPLICAOF", "127.0.0.1", redistest.FreePort(t)).Err() },
			func() error { return rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err() }},
		{"OOM", false,
			func() error {
				if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					return err
				}
				return rdb.ConfigSet(ctx, "maxmemory", "1").Err()
			},
			func() error { return rdb.ConfigSet(ctx, "maxmemory", "0").Err() }},
	} {
		for _, pre := range []string{"none", "foreign hash", "completed"} {
			t.Run(tc.name+"/"+pre, func(t *testing.T) {
				k := claim.NewKey(nil, tc.name+"/"+pre)
				rk := claim.RecordKey("refused:", k)
				s := claim.NewStore(rdb, "refused:", nil, claim.StringRecords(true))
				switch pre {
				case "completed":
					l, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Complete(ctx, &claim.Record{Status: 201, Body: []byte("done")}, time.Hour); err != nil {
						t.Fatal(err)
					}
				case "foreign hash":
					if err := rdb.HSet(ctx, rk, "x", "y").Err(); err != nil {
						t.Fatal(err)
					}
				}
				typ0, val0 := rdb.Type(ctx, rk).Val(), rdb.Dump(ctx, rk).Val()
				if err := tc.refuse(); err != nil {
					t.Fatal(err)
				}
				l, r, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
				if err := tc.allow(); err != nil {
					t.Fatal(err)
				}
				if pre == "completed" {
					if l != nil || err != nil || r == nil || r.Status != 201 || string(r.Body) != "done" {
						t.Errorf("string claim of a completed key, writes refused by %s: lease %v, record %+v, err %v; want its replay",
							tc.name, l != nil, r, err)
					}
				} else if l != nil || r != nil || err == nil || claim.Unavailable(err) != tc.unavailable {
					t.Errorf("string claim refused by %s: lease %v, record %v, err %v (unavailable %v); want an error, unavailable %v",
						tc.name, l != nil, r != nil, err, claim.Unavailable(err), tc.unavailable)
				}
				if typ, val := rdb.Type(ctx, rk).Val(), rdb.Dump(ctx, rk).Val(); typ != typ0 || val != val0 {
					t.Errorf("after the refusal: record %s %q (was %s %q)", typ, val, typ0, val0)
				}
			})
		}
	}
}
