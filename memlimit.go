package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/rs/zerolog"
)

// containerMemoryLimit reads the memory limit of the process's cgroup (v1 or
// v2, nested paths included: the part worth a library); memlimit.ErrNoLimit
// when there is none. A variable so that a test can stand in for a container.
var containerMemoryLimit = memlimit.FromCgroup

// proxyBaseBytes is what the README's sizing adds for everything but the
// buffers and the replay cache: the runtime, connections, Redis clients.
const proxyBaseBytes = 30 << 20

// applyMemoryLimit gives Go's collector the container's memory limit: left
// alone, the heap grows to about twice what is live between collections
// whatever the limit, and a burst that the buffers' bound admits can still
// get the process OOM-killed with every claim it holds in flight. With
// GOMEMLIMIT at GOMEMLIMIT_RATIO of the limit, the collector works harder
// as the heap nears it instead. An explicit GOMEMLIMIT (the runtime has
// applied it already) or a ratio of 0 leaves the runtime as it is. It also
// warns, for the log and /readyz, when the configured buffers and cache need
// more than the container has.
//
// It returns the container's limit when it set Go's from it (0 otherwise):
// followMemoryLimit then keeps the two together.
func applyMemoryLimit(cfg *Config, logger zerolog.Logger) uint64 {
	limit, err := containerMemoryLimit()
	switch {
	case errors.Is(err, memlimit.ErrNoLimit), err == nil && limit > math.MaxInt64:
		logger.Debug().Msg("no container memory limit: Go's memory limit left as it is")
		return 0
	case err != nil:
		logger.Info().Err(err).Msg("container memory limit unknown: Go's memory limit left as it is (GOMEMLIMIT sets one)")
		return 0
	}
	if msg := memoryShortfall(cfg, limit); msg != "" {
		cfg.warnings = append(cfg.warnings, msg)
	}
	// gomemlimit is always the limit in force, in bytes (a number: log
	// stores fix a field's type by its first value); GOMEMLIMIT as given,
	// a string, goes in gomemlimit_env (not "GOMEMLIMIT": readers that
	// ignore case would see one field of two types).
	ev := logger.Info().Uint64("container_memory_limit", limit)
	switch {
	case cfg.goMemLimit != "" && debug.SetMemoryLimit(-1) == math.MaxInt64:
		ev.Str("gomemlimit_env", cfg.goMemLimit).Msg("no Go memory limit: GOMEMLIMIT sets none; GOMEMLIMIT_RATIO not applied")
	case cfg.goMemLimit != "":
		ev.Int64("gomemlimit", debug.SetMemoryLimit(-1)).Str("gomemlimit_env", cfg.goMemLimit).
			Msg("Go's memory limit set by GOMEMLIMIT; GOMEMLIMIT_RATIO not applied")
	case cfg.GoMemLimitRatio == 0:
		ev.Msg("GOMEMLIMIT_RATIO=0: Go's memory limit left as it is")
	default:
		set := int64(float64(limit) * cfg.GoMemLimitRatio)
		debug.SetMemoryLimit(set)
		ev.Int64("gomemlimit", set).Float64("ratio", cfg.GoMemLimitRatio).
			Msg("Go's memory limit set from the container's (GOMEMLIMIT_RATIO)")
		return limit
	}
	return 0
}

// memoryShortfall is the warning for a container whose memory limit is
// below what the buffers and the cache may need; "" when it is not.
func memoryShortfall(cfg *Config, limit uint64) string {
	// In floating point: MAX_BUFFERED_BYTES has no upper bound, and twice a
	// value set "out of the way" would wrap in int64.
	need := 2*float64(cfg.MaxBufferedBytes) + float64(cfg.ReplayCacheBytes) + proxyBaseBytes
	if float64(limit) >= need {
		return ""
	}
	return fmt.Sprintf(
		"MAX_BUFFERED_BYTES=%d and REPLAY_CACHE_BYTES=%d need about %.0f MiB (twice the first, the second and 30 MiB), more than the container's memory limit of %d MiB: under load the process may be killed, with every claim it holds in flight; raise the limit or lower them",
		cfg.MaxBufferedBytes, cfg.ReplayCacheBytes, math.Ceil(need/(1<<20)), limit>>20)
}

// memoryLimitEvery is how often followMemoryLimit reads the container's
// limit: a few small files, and a resize is followed within it. A variable
// so that a test need not wait for it.
var memoryLimitEvery = 30 * time.Second

// followMemoryLimit reads the container's memory limit (read, a stand-in
// for containerMemoryLimit) every interval until ctx ends, and moves Go's
// memory limit with it when it changes: Kubernetes resizes a running pod's
// memory in place (stable since 1.35), and a limit read only at start
// stays above a lowered one, where the process is killed under load with
// every claim it holds in flight, or below a raised one, where the
// collector works for nothing. last is the limit applyMemoryLimit set
// Go's from, 0 when it found none (a limit added later is followed too).
// A read that fails or finds no limit (or 0) leaves Go's as it is; the
// first failure of a run of them is logged, and the first read after.
func followMemoryLimit(ctx context.Context, cfg *Config, logger zerolog.Logger, read func() (uint64, error), last uint64, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	unreadable := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		limit, err := read()
		// A follower that cannot read is said once, and its recovery: not
		// every 30 s, and not never.
		failed := err != nil && !errors.Is(err, memlimit.ErrNoLimit) &&
			!errors.Is(err, memlimit.ErrNoCgroup) && !errors.Is(err, memlimit.ErrCgroupsNotSupported) // no container, not a failure
		switch {
		case failed && !unreadable:
			logger.Warn().Err(err).Msg("container memory limit unreadable: Go's memory limit stays as it is until a read succeeds")
		case !failed && unreadable:
			logger.Info().Msg("container memory limit readable again")
		}
		unreadable = failed
		if err != nil || limit == 0 || limit > math.MaxInt64 || limit == last {
			continue
		}
		set := int64(float64(limit) * cfg.GoMemLimitRatio)
		debug.SetMemoryLimit(set)
		logger.Info().Uint64("container_memory_limit", limit).Uint64("previous_container_memory_limit", last).
			Int64("gomemlimit", set).Float64("ratio", cfg.GoMemLimitRatio).
			Msg("container memory limit changed (a pod resized in place): Go's memory limit follows it")
		if msg := memoryShortfall(cfg, limit); msg != "" {
			logger.Warn().Msg(msg)
		}
		last = limit
	}
}
