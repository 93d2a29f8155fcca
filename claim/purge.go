package claim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// PurgeChannel is the Pub/Sub channel on which `idemproxy keys purge`
// announces a purged key hash (64 hex digits), so that every replica drops
// it from its replay cache.
func PurgeChannel(prefix string) string { return prefix + "purge" }

// Subscriber opens a Pub/Sub subscription; the standalone, Sentinel and
// Cluster clients of go-redis all are one.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// subscribeConfirmWait bounds the wait for Redis's confirmation of the
// purge subscription (or its refusal).
const subscribeConfirmWait = 5 * time.Second

// purgeIdleCheck: a subscription that has heard nothing for this long is
// asked for a PING; no answer by the next check ends it. A connection that
// closed is noticed at once, one that hangs silently within twice this.
const purgeIdleCheck = 10 * time.Second

// Backoff between subscription attempts that Redis refused, did not
// answer, or lost.
const (
	subscribeRetryFirst = time.Second
	subscribeRetryMax   = 30 * time.Second
)

// WatchPurges drops every key announced on PurgeChannel from the replay
// cache until ctx ends, then returns nil. A purged record would otherwise
// still be replayed from memory for up to the cache's maximum age.
//
// The cache is on only while the subscription stands, confirmed by Redis:
// from the confirmation on (the cache starting empty, since a purge may have
// been missed before), until Redis refuses it (a user whose ACL has no such
// channel: NOPERM), the connection is lost or stops answering. Then the
// cache is turned off, the error handed to report, and a new subscription
// tried, backing off from 1 s to 30 s; report gets nil when one is
// confirmed. (go-redis's own re-subscription is not used: a refusal of it
// goes unseen, and the cache would stay on while no purge can reach it.)
// Without a replay cache it returns at once and subscribes to nothing.
// report may be nil.
func (s *Store) WatchPurges(ctx context.Context, sub Subscriber, report func(error)) error {
	if s.cache == nil {
		return nil
	}
	if report == nil {
		report = func(error) {}
	}
	backoff := subscribeRetryFirst
	for {
		ps := sub.Subscribe(ctx, PurgeChannel(s.prefix))
		stop := context.AfterFunc(ctx, func() { _ = ps.Close() }) // ends a read under way at once
		confirmed, err := s.follow(ctx, ps, report)
		stop()
		// Closed in the background: while go-redis redials a stalled Redis
		// it holds the PubSub's lock for a dial and read timeout (seconds),
		// and Close waits for it; the caller (shutdown) must not.
		go ps.Close()
		if ctx.Err() != nil {
			return nil
		}
		s.cache.setOff(true)
		report(fmt.Errorf("subscription to %s: %w", PurgeChannel(s.prefix), err))
		if confirmed {
			backoff = subscribeRetryFirst // it stood: this is a new trouble
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, subscribeRetryMax)
	}
}

// follow reads the subscription ps until it fails (the error) or ctx ends:
// Redis's confirmation turns the cache on, each announcement evicts its key.
// confirmed reports whether Redis had confirmed it.
func (s *Store) follow(ctx context.Context, ps *redis.PubSub, report func(error)) (confirmed bool, _ error) {
	pinged := false
	for {
		wait := purgeIdleCheck
		if !confirmed {
			wait = subscribeConfirmWait
		}
		msg, err := ps.ReceiveTimeout(ctx, wait)
		if ctx.Err() != nil {
			return confirmed, ctx.Err()
		}
		var ne net.Error
		switch {
		case err == nil:
		case !confirmed:
			return false, fmt.Errorf("not confirmed: %w", err)
		case errors.As(err, &ne) && ne.Timeout() && !pinged:
			if err := ps.Ping(ctx); err != nil {
				return true, fmt.Errorf("ping: %w", err)
			}
			pinged = true
			continue
		case errors.As(err, &ne) && ne.Timeout():
			return true, fmt.Errorf("no answer to a PING within %v", purgeIdleCheck)
		default:
			return true, err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			switch {
			case m.Kind == "subscribe" && !confirmed:
				confirmed = true
				s.cache.setOff(false)
				report(nil)
			case m.Kind != "subscribe":
				return confirmed, fmt.Errorf("unexpected %s", m.Kind)
			}
		case *redis.Message:
			if k, err := ParseKeyHash(m.Payload); err == nil {
				s.cache.evict(k)
			}
		case *redis.Pong:
		default:
			if !confirmed {
				return false, fmt.Errorf("unexpected first reply %T %v", msg, msg)
			}
		}
	}
}
