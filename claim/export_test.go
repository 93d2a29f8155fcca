package claim

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// The tests watch purges with a probe every 2 s instead of every 10 s, so
// that idleness and a switched master take seconds to show. Set before any
// test runs.
func init() { purgeProbeEvery = 2 * time.Second }

// PurgeProbeEvery is the probe period the tests run with.
func PurgeProbeEvery() time.Duration { return purgeProbeEvery }

// CompleteOnce is one attempt of Complete, without its retries: a test of a
// refused completion need not wait out CompleteBudget.
func (l *Lease) CompleteOnce(ctx context.Context, rec *Record, ttl time.Duration) error {
	return l.completeOnce(ctx, rec.Encode(), ttl, "c", "")
}

// CLAIM_TEST_RECORD_FORMAT=string runs this package's tests with every
// Store writing string records (RECORD_FORMAT=string); `make test` runs the
// package once each way.
func init() {
	switch f := os.Getenv("CLAIM_TEST_RECORD_FORMAT"); f {
	case "", "hash":
	case "string":
		defaultFormat = "s"
	default:
		panic(fmt.Sprintf("CLAIM_TEST_RECORD_FORMAT=%q: want hash or string", f))
	}
}

// RunScript runs the claim or complete script once on k's keys, with the
// script's own arguments, as go-redis sends it again after a lost reply,
// and returns the status it replied.
func (s *Store) RunScript(ctx context.Context, name string, k Key, args ...any) (string, error) {
	sc := map[string]*redis.Script{"claim": claimScript, "complete": completeScript}[name]
	v, err := sc.Run(ctx, s.rdb, s.keys(k), args...).Result()
	status, _, err := decodeReply(v, err)
	return status, err
}

// MS is how the scripts take a duration: whole milliseconds, at least 1.
var MS = ms
