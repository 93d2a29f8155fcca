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
// on, from empty (a purge may have been missed before), when the
// subscription is verified end to end: Redis confirmed it, and a probe
// published through sub (where `idemproxy keys purge` publishes) came back
// on it. A probe follows every purgeProbeEvery, and must come back within as
// long. The cache is off as soon as the subscription fails, whatever the
// cause: Redis refused it (a user whose ACL has no such channel: NOPERM),
// its connection closed, or a probe could not be published (no PUBLISH) or
// was not heard in time (Redis unreachable included: a replica cut off from
// Redis cannot hear a purge made from elsewhere). The deadlines are the
// watch's own, kept while go-redis is blocked in a read, a redial or a
// PUBLISH (its clients do not apply context deadlines to sockets). Each
// failure is handed to report, and a new subscription tried, backing off
// from 1 s to 30 s; report gets nil when one is verified. (go-redis's own
// re-subscription is not relied on: a refusal of it goes unseen.) Without a
// replay cache it returns at once and subscribes to nothing. report may be
// nil.
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
		verified, err := s.follow(ctx, sub, ps, report)
		// Closed in the background: while go-redis redials a stalled Redis
		// it holds the PubSub's lock for a dial and read timeout (seconds),
		// and Close waits for it; the caller (shutdown) must not. Closing
		// also ends follow's reader.
		go ps.Close()
		if ctx.Err() != nil {
			return nil
		}
		s.cache.setOff(true)
		report(fmt.Errorf("subscription to %s: %w", PurgeChannel(s.prefix), err))
		if verified {
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

// received is one ReceiveTimeout's result.
type received struct {
	msg any
	err error
}

// follow watches the subscription ps until it fails (the error) or ctx
// ends. A reader goroutine receives; this loop keeps the time, so that a
// go-redis call blocked in a read, a redial or a PUBLISH cannot hold the
// cache on past a deadline. verified reports whether a probe had come
// back (the cache was on).
func (s *Store) follow(ctx context.Context, sub Subscriber, ps *redis.PubSub, report func(error)) (verified bool, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan received)
	go func() {
		for {
			msg, err := ps.ReceiveTimeout(ctx, purgeProbeEvery)
			var ne net.Error
			if err != nil && errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
				continue // quiet: the loop below keeps the time
			}
			select {
			case msgs <- received{msg, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var (
		confirmed bool
		probe     string     // the probe awaited; "" none
		published chan error // its PUBLISH's result; nil once known
	)
	timer := time.NewTimer(subscribeConfirmWait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return verified, ctx.Err()
		case r := <-msgs:
			if r.err != nil {
				if !confirmed {
					return false, fmt.Errorf("not confirmed: %w", r.err)
				}
				return verified, r.err
			}
			switch m := r.msg.(type) {
			case *redis.Subscription:
				switch {
				case m.Kind == "subscribe" && !confirmed:
					// Confirmed; the first probe at once.
					confirmed = true
					timer.Reset(0)
				case m.Kind != "subscribe":
					return verified, fmt.Errorf("unexpected %s", m.Kind)
				}
			case *redis.Message:
				if probe != "" && m.Payload == probe {
					probe = ""
					timer.Reset(purgeProbeEvery) // the next probe
					if !verified {
						verified = true
						s.cache.setOff(false)
						report(nil)
					}
				} else if k, err := ParseKeyHash(m.Payload); err == nil {
					s.cache.evict(k)
				}
			case *redis.Pong:
			default:
				if !confirmed {
					return false, fmt.Errorf("unexpected first reply %T %v", r.msg, r.msg)
				}
			}
		case err := <-published:
			published = nil
			if err != nil {
				// Unverified is untrusted: a replica that cannot publish
				// where purges are cannot tell whether it hears them.
				return verified, fmt.Errorf("publish its probe: %w", err)
			}
		case <-timer.C:
			switch {
			case !confirmed:
				return false, fmt.Errorf("not confirmed within %v", subscribeConfirmWait)
			case probe != "":
				return verified, fmt.Errorf("did not hear its own probe within %v: it is not on the node where purges are published (a failover that could not reconfigure the old master?), its connection hangs, or this replica is cut off from Redis", purgeProbeEvery)
			}
			token, err := newProbe()
			if err != nil {
				return verified, err
			}
			probe, published = token, make(chan error, 1)
			go func(done chan<- error) {
				pctx, cancel := context.WithTimeout(ctx, probePublishWait)
				defer cancel()
				done <- sub.Publish(pctx, PurgeChannel(s.prefix), token).Err()
			}(published)
			timer.Reset(purgeProbeEvery) // it must come back within this
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
