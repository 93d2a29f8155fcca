package claim

import (
	"context"

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

// WatchPurges drops every key announced on PurgeChannel from the replay
// cache until ctx ends, then returns nil. A purged record would otherwise
// still be replayed from memory for up to the cache's maximum age.
//
// go-redis re-subscribes by itself after a lost connection; a purge
// announced meanwhile is not heard, so the whole cache is dropped each time
// the subscription is (re)established. Without a replay cache it returns at
// once and subscribes to nothing.
func (s *Store) WatchPurges(ctx context.Context, sub Subscriber) error {
	if s.cache == nil {
		return nil
	}
	ps := sub.Subscribe(ctx, PurgeChannel(s.prefix))
	// Closed in the background: while go-redis redials a stalled Redis it
	// holds the PubSub's lock for a dial and read timeout (seconds), and
	// Close waits for it; the caller (shutdown) must not.
	defer func() { go ps.Close() }()
	ch := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-ch:
			if !ok {
				return nil
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
