package claim_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestWaitReplicas: with WaitReplicas, claims and completions are
// acknowledged by a replica; with the replica gone, a claim is refused
// (ErrNotReplicated) and released rather than left in flight.
func TestWaitReplicas(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t, "replicaof 127.0.0.1 "+strconv.Itoa(master.Port()))
	mc, rc := master.Client(), replica.Client()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Synced on the replica's side, and online (acknowledging) on the master's.
		info, err := rc.Info(ctx, "replication").Result()
		minfo, merr := mc.Info(ctx, "replication").Result()
		if err == nil && merr == nil && strings.Contains(info, "master_link_status:up") && strings.Contains(minfo, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not sync within 10s: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}

	s := claim.NewStore(mc, "test:", nil, claim.WaitReplicas(1, 3*time.Second))
	key := claim.NewKey(nil, "replicated")
	lease, _, err := s.Acquire(ctx, key, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatalf("Acquire with a live replica: %v", err)
	}
	// The claim is on the replica the moment Acquire returns.
	if n, err := rc.Exists(ctx, "test:{"+hexKey(key)+"}").Result(); err != nil || n != 1 {
		t.Errorf("replica has the claim: %d, %v; want 1", n, err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 201}, time.Hour); err != nil {
		t.Fatalf("Complete with a live replica: %v", err)
	}
	if st := recordFields(t, rc, "test:{"+hexKey(key)+"}")["st"]; st != "c" {
		t.Errorf("replica's record state %q; want c", st)
	}

	// NOSCRIPT goes through the pipelined path too.
	if err := mc.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Acquire(ctx, claim.NewKey(nil, "after-flush"), fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
	}

	replica.Kill()
	s = claim.NewStore(mc, "test:", nil, claim.WaitReplicas(1, 500*time.Millisecond))
	start := time.Now()
	lone := claim.NewKey(nil, "unreplicated")
	_, _, err = s.Acquire(ctx, lone, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if !errors.Is(err, claim.ErrNotReplicated) {
		t.Fatalf("Acquire without replica: got %v, want ErrNotReplicated", err)
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("gave up after %v, before the 500ms WAIT timeout", took)
	}
	// Released, not left in flight: a store without WaitReplicas claims it.
	if lease, _, err := claim.NewStore(mc, "test:", nil).Acquire(ctx, lone, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || lease == nil {
		t.Errorf("after ErrNotReplicated: got %v, %v; want the key free", lease, err)
	}
}

func hexKey(k claim.Key) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 0, 2*len(k))
	for _, c := range k {
		b = append(b, digits[c>>4], digits[c&15])
	}
	return string(b)
}
