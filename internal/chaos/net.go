package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"
)

var quietToxics sync.Once

// Net puts a toxiproxy link (Shopify's toxiproxy, used as a library, in
// this process) between each proxy slot and Redis, and between each slot
// and the upstream, so that faults can be injected on one link at a time.
type Net struct {
	srv   *toxiproxy.ApiServer
	redis []*toxiproxy.Proxy // nil when the topology is not standalone
	up    []*toxiproxy.Proxy

	mu     sync.Mutex
	active map[*toxiproxy.Proxy][]string // toxics in place, by name
}

// NewNet starts the links: slot i's upstream link forwards to upstreamAddr(i),
// its Redis link (when redisAddr is not empty) to redisAddr.
func NewNet(n int, redisAddr string, upstreamAddr func(int) string) (*Net, error) {
	quietToxics.Do(func() {
		// Some toxics (bandwidth) log at trace level through zerolog's
		// global logger, on this process's stderr: a line per chunk. Set
		// once, before any toxic runs.
		log.Logger = zerolog.Nop()
	})
	nt := &Net{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), active: map[*toxiproxy.Proxy][]string{}}
	for i := range n {
		if redisAddr != "" {
			p := toxiproxy.NewProxy(nt.srv, fmt.Sprintf("redis-%d", i), "127.0.0.1:0", redisAddr)
			if err := p.Start(); err != nil {
				nt.Close()
				return nil, fmt.Errorf("toxiproxy redis link %d: %w", i, err)
			}
			nt.redis = append(nt.redis, p)
		}
		p := toxiproxy.NewProxy(nt.srv, fmt.Sprintf("up-%d", i), "127.0.0.1:0", upstreamAddr(i))
		if err := p.Start(); err != nil {
			nt.Close()
			return nil, fmt.Errorf("toxiproxy upstream link %d: %w", i, err)
		}
		nt.up = append(nt.up, p)
	}
	return nt, nil
}

// RedisAddr is the address slot's proxy uses for Redis.
func (nt *Net) RedisAddr(slot int) string { return nt.redis[slot].Listen }

// UpstreamAddr is the address slot's proxy uses for the upstream.
func (nt *Net) UpstreamAddr(slot int) string { return nt.up[slot].Listen }

// Toxic is one toxiproxy toxic: its type ("latency", "timeout",
// "reset_peer", "slicer", "bandwidth"), its direction ("upstream": towards
// Redis or the API; "downstream": their answers) and attributes.
type Toxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Toxicity   float32        `json:"toxicity"`
	Attributes map[string]any `json:"attributes"`
}

// Add puts toxics on the link ("redis" or "up") of slot.
func (nt *Net) Add(link string, slot int, toxics ...Toxic) error {
	p := nt.link(link, slot)
	for _, tx := range toxics {
		tx.Toxicity = 1
		b, _ := json.Marshal(tx)
		if _, err := p.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
			return fmt.Errorf("add toxic %s to %s: %w", tx.Name, p.Name, err)
		}
		nt.mu.Lock()
		nt.active[p] = append(nt.active[p], tx.Name)
		nt.mu.Unlock()
	}
	return nil
}

// Heal removes every toxic from every link.
func (nt *Net) Heal() {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	for p, names := range nt.active {
		for _, name := range names {
			_ = p.Toxics.RemoveToxic(context.Background(), name)
		}
	}
	nt.active = map[*toxiproxy.Proxy][]string{}
}

func (nt *Net) link(link string, slot int) *toxiproxy.Proxy {
	if link == "redis" {
		return nt.redis[slot]
	}
	return nt.up[slot]
}

// Close stops every link and its connections.
func (nt *Net) Close() {
	for _, p := range append(append([]*toxiproxy.Proxy(nil), nt.redis...), nt.up...) {
		p.Stop()
	}
}
