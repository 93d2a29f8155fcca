package claim_test

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// review14gWorld is one Redis (miniredis, virtual clock) with replicas
// sharing it.
type review14gWorld struct {
	mr     *miniredis.Miniredis
	rdb    *redis.Client
	stores []*claim.Store
	in     *claim.Inspector
	leases map[int]*claim.Lease
	virt   time.Time
}

func review14gDescribe(err error) string {
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

// TestReview14gFormsDifferential (passes: evidence, not a finding): random
// lives of two keys (claims by four replicas with random upstreams, hold or
// expire, completions with and without trace, holds, releases, time passing
// past locks and TTLs, purges, pre-upgrade claim marks, inspection) run
// twice: once with every replica writing hashes, once with each replica's
// RECORD_FORMAT drawn at random. Every step must answer the same in both
// worlds (status, replayed bytes and trace, takeover age, Recreated,
// AlreadyUnknown, what keys get reads, TTLs). R14G_SEEDS raises the number
// of lives (default 60).
func TestReview14gFormsDifferential(t *testing.T) {
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
		world := func(mixed bool) *review14gWorld {
			mr := miniredis.RunT(t)
			w := &review14gWorld{mr: mr, rdb: redis.NewClient(&redis.Options{Addr: mr.Addr()}), leases: map[int]*claim.Lease{}}
			t.Cleanup(func() { _ = w.rdb.Close() })
			w.virt = time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
			mr.SetTime(w.virt)
			for i := range nStores {
				w.stores = append(w.stores, claim.NewStore(w.rdb, "d:", nil, claim.StringRecords(mixed && strs[i]), claim.Upstream(ups[i])))
			}
			w.in = claim.NewInspector(w.rdb, "d:")
			return w
		}
		worlds := [2]*review14gWorld{world(false), world(true)}
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
					got[wi] = s + review14gDescribe(err)
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
					got[wi] = fmt.Sprintf("lease%d op%d: %s recreated=%v already=%v", lid, lop, review14gDescribe(err), l.Recreated, l.AlreadyUnknown)
				case 5:
					w.virt = w.virt.Add(adv)
					w.mr.SetTime(w.virt)
					w.mr.FastForward(adv)
					got[wi] = fmt.Sprint("advance ", adv)
				case 6:
					e, err := w.in.Get(ctx, k)
					if e == nil {
						got[wi] = "get " + review14gDescribe(err)
						break
					}
					got[wi] = fmt.Sprintf("get k%d %s %d at=%v ct=%v ld=%v ttl=%v up=%q tr=%q %s", ki, e.State, e.Status,
						e.ClaimedAt, e.CompletedAt, e.LockExpiresAt, e.TTL, e.Upstream, e.Trace, review14gDescribe(err))
				case 7:
					ok, err := w.in.Purge(ctx, k)
					got[wi] = fmt.Sprintf("purge k%d %v %s", ki, ok, review14gDescribe(err))
				case 8:
					rk := claim.RecordKey("d:", k)
					err := w.rdb.Set(ctx, rk+":m", strconv.FormatInt(w.virt.UnixMilli()-50, 10), time.Hour).Err()
					got[wi] = "mark " + review14gDescribe(err)
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
