package claim_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

func ExampleStore() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	ctx := context.Background()
	store := claim.NewStore(rdb, "idem:", nil)
	key := claim.NewKey([]string{"Bearer sk_test"}, "order-42")
	var fp claim.Fingerprint // SHA-256 of method, path, query and body

	lease, _, _ := store.Acquire(ctx, key, fp, claim.Terms{LockTTL: time.Minute, TTL: 24 * time.Hour})
	_, _, err := store.Acquire(ctx, key, fp, claim.Terms{LockTTL: time.Minute, TTL: 24 * time.Hour})
	fmt.Println("duplicate while running:", err)

	_ = lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte(`{"order":42}`)}, 24*time.Hour)
	_, rec, _ := store.Acquire(ctx, key, fp, claim.Terms{LockTTL: time.Minute, TTL: 24 * time.Hour})
	fmt.Println("retry replays:", rec.Status, string(rec.Body))
	// Output:
	// duplicate while running: claim: in flight
	// retry replays: 201 {"order":42}
}
