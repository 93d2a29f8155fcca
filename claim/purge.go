package claim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

// Subscriber is what WatchPurges needs of a Redis client: go-redis's
// standalone, Sentinel and Cluster clients all are one.
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
}

// subscribeConfirmWait bounds the wait for Redis's confirmation of the
// purge subscription (or its refusal).
const subscribeConfirmWait = 5 * time.Second

// purgeProbeEvery: a confirmed subscription publishes a probe of its own
// this often, through the command connection (where `idemproxy keys purge`
// publishes too), and must hear it back within as long. One that does not
// is not where purges are published (Sentinel moved the master but could
// not reconfigure the old one, which still answers), or its connection
// hangs, or this replica is cut off from Redis.
var purgeProbeEvery = 10 * time.Second // (a variable: the tests shorten it)

// probePublishWait bounds the probe's PUBLISH.
const probePublishWait = 2 * time.Second

// Backoff between subscription attempts.
const (
	subscribeRetryFirst = time.Second
	subscribeRetryMax   = 30 * time.Second
)

// WatchPurges drops every key announced on PurgeChannel from the replay
// cache until ctx ends, then returns nil. A purged record would otherwise
// still be replayed from memory for up to the cache's maximum age.
//
// The cache answers only while a purge is known to reach it. It is turned
// on, from empty (a purge may have been missed before), when Redis
// confirms the subscription, and off as soon as the subscription fails:
// Redis refused it (a user whose ACL has no such channel: NOPERM), its
// connection closed, or its probe could not be published or was not heard
// back. Whatever the cause, Redis unreachable included: a replica cut off
// from Redis cannot hear a purge made from elsewhere. Each failure is handed
// to report, and a new subscription tried, backing off from 1 s to 30 s;
// report gets nil at each confirmation. (go-redis's own re-subscription is
// not used: a refusal of it goes unseen.) Without a replay cache it returns
// at once and subscribes to nothing. report may be nil.
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
		confirmed, err := s.follow(ctx, sub, ps, report)
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
// Redis's confirmation turns the cache on, each announcement evicts its key,
// and a probe published through sub every purgeProbeEvery must come back.
// confirmed reports whether Redis had confirmed the subscription.
func (s *Store) follow(ctx context.Context, sub Subscriber, ps *redis.PubSub, report func(error)) (confirmed bool, _ error) {
	var probe string        // the probe awaited; "" none
	var due, next time.Time // when it must have come back; when the next is sent
	for {
		wait := subscribeConfirmWait
		if confirmed {
			wait = time.Until(next)
			if probe != "" {
				wait = time.Until(due)
			}
			wait = max(wait, time.Millisecond)
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
		case !errors.As(err, &ne) || !ne.Timeout():
			return true, err
		case probe != "" && !time.Now().Before(due):
			return true, fmt.Errorf("did not hear its own probe within %v: it is not on the node where purges are published (a failover that could not reconfigure the old master?), its connection hangs, or this replica is cut off from Redis", purgeProbeEvery)
		case probe == "" && !time.Now().Before(next):
			token, err := newProbe()
			if err != nil {
				return true, err
			}
			pctx, cancel := context.WithTimeout(ctx, probePublishWait)
			err = sub.Publish(pctx, PurgeChannel(s.prefix), token).Err()
			cancel()
			if err != nil {
				// Unverified is untrusted: a replica that cannot publish
				// where purges are cannot tell whether it hears them.
				return true, fmt.Errorf("publish its probe: %w", err)
			}
			probe, due = token, time.Now().Add(purgeProbeEvery)
			continue
		default:
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch {
			case m.Kind == "subscribe" && !confirmed:
				confirmed, next = true, time.Now().Add(purgeProbeEvery)
				s.cache.setOff(false)
				report(nil)
			case m.Kind != "subscribe":
				return confirmed, fmt.Errorf("unexpected %s", m.Kind)
			}
		case *redis.Message:
			if probe != "" && m.Payload == probe {
				probe, next = "", time.Now().Add(purgeProbeEvery)
			} else if k, err := ParseKeyHash(m.Payload); err == nil {
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

// newProbe is a payload no key hash can be (every replica hears every
// probe, and ignores the others').
func newProbe() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("purge probe: %w", err)
	}
	return "probe-" + hex.EncodeToString(b[:]), nil
}
