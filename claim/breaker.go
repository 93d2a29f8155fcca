package claim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrStoreDown: a command was not sent because its Redis server is known
// to be unreachable (a Breaker is open). Unavailable reports it as an
// outage: fail-closed routes answer 503 and fail-open routes forward, at
// once.
var ErrStoreDown = errors.New("claim: Redis unreachable; not asked again until it answers a probe")

// Breaker is a go-redis Limiter (Options.Limiter) that fails a client's
// commands at once while its server is known to be unreachable, and probes
// the server in the background until it answers again.
//
// Without it each command finds out for itself: against a server that
// refuses connections that takes a dial, but against one that stopped
// answering (a network partition, a paused or overloaded process) every
// attempt waits out a read timeout, and behind the autopipeliner's single
// ordered batch stream the waits add up: requests waited tens of seconds for
// their 503, or for FAIL_MODE=open's forward. go-redis asks a Limiter before
// every attempt and tells it every attempt's result.
//
// A failed connection is not yet an outage: Redis closes connections it is
// alive to close (CLIENT KILL, which Sentinel sends to every instance it
// reconfigures; an output-buffer limit; a load balancer's reset), and
// go-redis's retry on a fresh connection then succeeds. So a failure of the
// connection only starts a probe, at once; the Breaker opens when that probe
// fails too, and from then on every attempt (a retry, a batch queued behind)
// fails at once until a later probe succeeds. The first commands of an
// outage wait one dial or read timeout, and at most one probe's timeout
// more.
//
// An error reply of the server (LOADING, READONLY, OOM...) comes back at
// once and says nothing about reachability, nor does a caller giving up
// (its context): neither starts a probe.
//
// One Breaker guards one server: the client of a standalone Redis or of a
// Sentinel-monitored master (whose probe then follows a failover), or one
// node client of a Cluster (so one dead master does not fail the others).
// Its probe must go through a client of its own, which the Breaker does not
// guard. A Cluster node that failed over away is no longer one the proxy
// uses (InUse): its open Breaker then stops probing and reports itself
// closed, and probes again if it is asked for anything.
type Breaker struct {
	probe   func(context.Context) error
	every   time.Duration
	timeout time.Duration
	notify  func(open bool, cause error)
	inUse   func(context.Context) bool // nil: always

	open     atomic.Bool
	probing  atomic.Bool // a probe goroutine runs
	reported atomic.Bool // notify was last told open (false: closed, or retired)
	stop     chan struct{}
	ctx      context.Context // the probes' parent: Close cancels a probe under way
	cancel   context.CancelFunc
	once     sync.Once
	wg       sync.WaitGroup
	cause    atomic.Pointer[error] // why it opened, for ErrStoreDown's message
}

// InUse tells the Breaker how to learn that its server is no longer used
// (a Cluster node that is no longer a master): while open, it asks before
// each probe, and stops probing and reports itself closed when it is not.
// Call it before the Breaker is used.
func (b *Breaker) InUse(f func(context.Context) bool) { b.inUse = f }

// NewBreaker returns a Breaker whose probe asks the server whether it
// answers (a PING through a client of its own), at once when a connection
// fails and then every interval while it is open, each bounded by timeout.
// notify, when set, hears every change: open with the error that opened it,
// then closed (nil) when the server answers or when nothing has asked for
// it in a while.
func NewBreaker(probe func(context.Context) error, every, timeout time.Duration, notify func(open bool, cause error)) *Breaker {
	if notify == nil {
		notify = func(bool, error) {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Breaker{probe: probe, every: every, timeout: timeout, notify: notify, stop: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// Open reports whether attempts are failed at once now.
func (b *Breaker) Open() bool { return b.open.Load() }

// Close stops the background probe, a probe under way included (the
// guarded client is being closed: shutting down must not wait a probe's
// timeout).
func (b *Breaker) Close() {
	b.once.Do(func() {
		b.cancel()
		close(b.stop)
	})
	b.wg.Wait()
}

// Allow implements redis.Limiter: go-redis asks before every attempt.
func (b *Breaker) Allow() error {
	if !b.open.Load() {
		return nil
	}
	if !b.probing.Load() {
		b.startProbe() // asked again after it retired: probe, and report it
	}
	if c := b.cause.Load(); c != nil {
		return fmt.Errorf("%w (since: %v)", ErrStoreDown, *c)
	}
	return ErrStoreDown
}

// ReportResult implements redis.Limiter: the result of every attempt that
// Allow let through. A connection failure starts a probe.
func (b *Breaker) ReportResult(err error) {
	if !connectionFailed(err) {
		return
	}
	b.cause.Store(&err)
	b.startProbe()
}

// startProbe starts the probe goroutine unless one runs.
func (b *Breaker) startProbe() {
	select {
	case <-b.stop:
		return // closing: nothing to probe for
	default:
	}
	if !b.probing.CompareAndSwap(false, true) {
		return
	}
	b.wg.Add(1)
	go b.probeUntilUp()
}

// probeUntilUp asks the server at once, then every b.every while it does
// not answer: the first failure opens the Breaker, the first answer closes
// it. It ends when the server answers, when it is no longer in use, or when
// the Breaker is closed for good.
func (b *Breaker) probeUntilUp() {
	defer b.wg.Done()
	defer b.probing.Store(false)
	var t *time.Ticker
	for {
		ctx, cancel := context.WithTimeout(b.ctx, b.timeout)
		err := b.probe(ctx)
		cancel()
		switch {
		case errors.Is(err, redis.ErrClosed) || b.ctx.Err() != nil:
			return // closed: nobody is waiting for it
		case err == nil:
			b.open.Store(false)
			if b.reported.CompareAndSwap(true, false) {
				b.notify(false, nil)
			}
			return
		}
		b.open.Store(true)
		if b.reported.CompareAndSwap(false, true) {
			if c := b.cause.Load(); c != nil {
				err = *c
			}
			b.notify(true, err)
		}
		if b.inUse != nil && !b.inUse(context.Background()) {
			// Not a server the proxy uses any more: not worth probing, nor
			// counting as unreachable. An Allow starts a probe again.
			if b.reported.CompareAndSwap(true, false) {
				b.notify(false, nil)
			}
			return
		}
		if t == nil {
			t = time.NewTicker(b.every)
			defer t.Stop()
		}
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
	}
}

// connectionFailed reports whether err says the server could not be
// reached or stopped answering, as opposed to an answer of the server, a
// caller giving up, or the client being closed.
func connectionFailed(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStoreDown) {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false // the server answered
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
