package claim_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
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
