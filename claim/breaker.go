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
// every attempt and tells it every attempt's result, so with a Breaker the
// first commands of an outage wait one dial or read timeout; from the first
// failed attempt on, every attempt (a retry, a batch queued behind) fails
// at once until a probe succeeds.
//
// Only failures of the connection open it (a refused or failed dial, a
// timeout, a connection closed under a command); an error reply of the
// server (LOADING, READONLY, OOM...) comes back at once and says nothing
// about reachability, and a caller giving up (its context) says nothing
// either.
//
// One Breaker guards one server: the client of a standalone Redis or of a
// Sentinel-monitored master (whose probe then follows a failover), or one
// node client of a Cluster (so one dead master does not fail the others).
// Its probe must go through a client of its own, which the Breaker does not
// guard.
type Breaker struct {
	probe   func(context.Context) error
	every   time.Duration
	timeout time.Duration
	notify  func(open bool, cause error)

	open  atomic.Bool
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	cause atomic.Pointer[error] // why it opened, for ErrStoreDown's message
}

// NewBreaker returns a Breaker whose probe asks the server whether it
// answers (a PING through a client of its own), every interval while it is
// open, each bounded by timeout. notify, when set, hears every change:
// open with the error that opened it, then closed (nil).
func NewBreaker(probe func(context.Context) error, every, timeout time.Duration, notify func(open bool, cause error)) *Breaker {
	if notify == nil {
		notify = func(bool, error) {}
	}
	return &Breaker{probe: probe, every: every, timeout: timeout, notify: notify, stop: make(chan struct{})}
}

// Open reports whether attempts are failed at once now.
func (b *Breaker) Open() bool { return b.open.Load() }

// Close stops the background probe (the guarded client is being closed).
func (b *Breaker) Close() {
	b.once.Do(func() { close(b.stop) })
	b.wg.Wait()
}

// Allow implements redis.Limiter: go-redis asks before every attempt.
func (b *Breaker) Allow() error {
	if !b.open.Load() {
		return nil
	}
	if c := b.cause.Load(); c != nil {
		return fmt.Errorf("%w (since: %v)", ErrStoreDown, *c)
	}
	return ErrStoreDown
}

// ReportResult implements redis.Limiter: the result of every attempt that
// Allow let through. A connection failure opens the Breaker and starts the
// probe.
func (b *Breaker) ReportResult(err error) {
	if !connectionFailed(err) {
		return
	}
	b.cause.Store(&err)
	if !b.open.CompareAndSwap(false, true) {
		return
	}
	select {
	case <-b.stop:
		return // closing: nothing to probe for
	default:
	}
	b.notify(true, err)
	b.wg.Add(1)
	go b.probeUntilUp()
}

// probeUntilUp asks the server every b.every until it answers, then closes
// the Breaker. It ends early when the Breaker is closed for good.
func (b *Breaker) probeUntilUp() {
	defer b.wg.Done()
	t := time.NewTicker(b.every)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		err := b.probe(ctx)
		cancel()
		if errors.Is(err, redis.ErrClosed) {
			return // the client is closed: nobody is waiting for it
		}
		if err == nil {
			b.open.Store(false)
			b.notify(false, nil)
			return
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
