package claim

import (
	"context"
	"fmt"
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

// Backoff between subscription attempts that Redis refused or did not
// answer.
const (
	subscribeRetryFirst = time.Second
	subscribeRetryMax   = 30 * time.Second
)

// WatchPurges drops every key announced on PurgeChannel from the replay
// cache until ctx ends, then returns nil. A purged record would otherwise
// still be replayed from memory for up to the cache's maximum age.
//
// It subscribes and waits for Redis to confirm. Until it does the cache is
// off with CacheAfterSubscribed; when Redis refuses (a user whose ACL has
// no such channel: NOPERM) or does not answer, the cache is turned off, the
// error handed to report, and the subscription tried again, backing off
// from 1 s to 30 s. Once confirmed, report gets nil and the cache is on,
// from empty. go-redis then re-subscribes by itself after a lost
// connection; a purge announced meanwhile is not heard, so the whole cache
// is dropped each time the subscription is re-established. Without a
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
		err := confirmed(ctx, ps)
		if err == nil {
			s.cache.setOff(false)
			report(nil)
			s.listen(ctx, ps)
			return nil
		}
		// Closed in the background, as below.
		go ps.Close()
		if ctx.Err() != nil {
			return nil
		}
		s.cache.setOff(true)
		report(fmt.Errorf("subscribe to %s: %w", PurgeChannel(s.prefix), err))
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

// confirmed waits for the first reply to the subscription: its
// confirmation, or why not.
func confirmed(ctx context.Context, ps *redis.PubSub) error {
	msg, err := ps.ReceiveTimeout(ctx, subscribeConfirmWait)
	if err != nil {
		return err
	}
	if m, ok := msg.(*redis.Subscription); !ok || m.Kind != "subscribe" {
		return fmt.Errorf("unexpected first reply %T %v", msg, msg)
	}
	return nil
}

// listen applies the announcements until ctx ends or the subscription is
// closed.
func (s *Store) listen(ctx context.Context, ps *redis.PubSub) {
	// Closed in the background: while go-redis redials a stalled Redis it
	// holds the PubSub's lock for a dial and read timeout (seconds), and
	// Close waits for it; the caller (shutdown) must not.
	defer func() { go ps.Close() }()
	ch := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			switch m := msg.(type) {
			case *redis.Subscription:
				s.cache.clear()
			case *redis.Message:
				if k, err := ParseKeyHash(m.Payload); err == nil {
					s.cache.evict(k)
				}
			}
		}
	}
}
