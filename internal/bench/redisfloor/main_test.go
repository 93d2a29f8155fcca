package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// Each mode does, on a real redis-server, what its figure claims to price:
// the product's scripts claim and complete a fresh key; minimal and
// commands write a claim and then the record, with the record's TTL, the
// first by two scripts, the second by two plain SETs and no script; return1
// writes nothing; onehash claims and completes with the least hash
// design's scripts. Each refuses a key already claimed (minimal, commands,
// scripts, onehash), so an iteration that silently did nothing would fail here.
func TestIterationModes(t *testing.T) {
	ctx, rdb, ap := startRedis(t)
	for _, mode := range []string{"scripts", "strings", "return1", "minimal", "commands", "onehash"} {
		t.Run(mode, func(t *testing.T) {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			iter, err := iteration(ap, mode, "idem:")
			if err != nil {
				t.Fatal(err)
			}
			// The answer carries a Date header: the record is the encoding
			// of the answer as of a second between these two.
			before := string(answer().Encode())
			if err := iter(ctx, "k1"); err != nil {
				t.Fatalf("first iteration: %v", err)
			}
			after := string(answer().Encode())
			keys, err := rdb.Keys(ctx, "idem:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			stats, err := rdb.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			scripted := strings.Contains(stats, "cmdstat_evalsha:") || strings.Contains(stats, "cmdstat_eval:")
			if mode == "return1" {
				if len(keys) != 0 || !scripted {
					t.Errorf("return1: keys %q, scripts run %v; want none written, scripts run", keys, scripted)
				}
				return
			}
			if len(keys) != 1 {
				t.Fatalf("keys %q, want one record", keys)
			}
			if ttl := rdb.PTTL(ctx, keys[0]).Val(); ttl < 23*time.Hour {
				t.Errorf("TTL %v, want the record's 24h", ttl)
			}
			switch mode {
			case "commands":
				if scripted || !strings.Contains(stats, "cmdstat_set:calls=2,") {
					t.Errorf("commands: want two SETs and no script:\n%s", stats)
				}
			default:
				if !scripted {
					t.Errorf("%s: no script ran:\n%s", mode, stats)
				}
			}
			hashed := mode == "scripts" || mode == "onehash"
			if typ := rdb.Type(ctx, keys[0]).Val(); hashed && typ != "hash" || !hashed && typ != "string" {
				t.Errorf("%s: the record is a Redis %s", mode, typ)
			}
			if mode == "onehash" {
				if v, err := rdb.HGet(ctx, keys[0], "rec").Result(); err != nil || v != before && v != after {
					t.Errorf("onehash record %q (%v), want the encoded answer", v, err)
				}
			} else if mode != "scripts" && mode != "strings" {
				if v, err := rdb.Get(ctx, keys[0]).Result(); err != nil || v != before && v != after {
					t.Errorf("record %q (%v), want the encoded answer", v, err)
				}
			}
			// The same key again is not a fresh key: the claim must refuse it.
			if err := iter(ctx, "k1"); err == nil {
				t.Errorf("a second iteration on the same key succeeded: the claim did not check")
			}
		})
	}
}

// startRedis starts a real redis-server for one test and returns a
// context bounding the test, a client, and the automatic pipeliner
// idemproxy sends through; all are closed when the test ends.
func startRedis(t *testing.T) (context.Context, *redis.Client, *redis.AutoPipeliner) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	ap, err := rdb.AutoPipelineWithOptions(claim.AutoPipelineOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ap.Close() })
	return ctx, rdb, ap
}
