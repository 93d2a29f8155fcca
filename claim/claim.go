// Package claim is the Redis side of idemproxy: it claims an idempotency key
// atomically, and completes or releases that claim under a fencing token.
//
// Every operation is one Lua script (package scripts) run with EVALSHA, with
// go-redis falling back to EVAL when the server answers NOSCRIPT (a restarted
// or newly promoted Redis has no scripts loaded). Each script touches the keys
// of one request only, and they share one hash tag, so Redis Cluster routes
// them to one node.
package claim

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/scripts"
)

// Sentinel errors returned by Store and Lease. Any other error is a failure to
// talk to Redis (or a reply this package does not understand).
var (
	// ErrInFlight: the key is claimed by a request that has not finished.
	ErrInFlight = errors.New("claim: in flight")
	// ErrMismatch: the key is held for a request with another fingerprint.
	ErrMismatch = errors.New("claim: fingerprint mismatch")
	// ErrOtherUpstream: the key is held for a request sent to another
	// upstream (see Upstream). It also matches ErrMismatch.
	ErrOtherUpstream = fmt.Errorf("%w: recorded in front of another upstream", ErrMismatch)
	// ErrLost: the claim is no longer ours (its lock expired and it was taken
	// over, or the record was removed); nothing was written.
	ErrLost = errors.New("claim: lost")
	// ErrBadRecord: the stored record could not be decoded (written by an
	// incompatible version, or corrupted). It is not a Redis outage.
	ErrBadRecord = errBadRecord
	// ErrNotReplicated: with WaitReplicas, the claim was not acknowledged by
	// enough replicas in time; it was released again. Treat it as Redis
	// being unavailable.
	ErrNotReplicated = errors.New("claim: not acknowledged by enough replicas")
	// ErrUnknown: the key's outcome is unknown and held for an operator
	// (Terms.Hold); the error is an *UnknownError.
	ErrUnknown = errors.New("claim: outcome unknown")
)

// UnknownError is returned by Acquire for a key whose outcome is unknown: its
// request may have executed (the upstream timed out or broke off after it
// was sent, or its proxy died while it was in flight), and with Terms.Hold
// it is not executed again until an operator purges the key.
type UnknownError struct {
	// Status is what the first request was answered (502 or 504; 504 when
	// its claim's lock expired).
	Status int
	// Entered is true when this very request found the claim's lock expired
	// and held the key as unknown.
	Entered bool
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("claim: outcome unknown (first answered %d)", e.Status)
}

// Is makes errors.Is(err, ErrUnknown) true.
func (e *UnknownError) Is(target error) bool { return target == ErrUnknown }

// Terms are how a claim is held.
type Terms struct {
	// LockTTL bounds the in-flight claim: after it, the next request takes
	// the key over (or, with Hold, finds its outcome unknown).
	LockTTL time.Duration
	// TTL is how long the record is kept: a completed answer is replayed
	// for this long, and an abandoned claim remembered.
	TTL time.Duration
	// Hold (ON_UNKNOWN=hold): a claim whose lock expired is never taken
	// over; the key's outcome becomes unknown until an operator purges it.
	Hold bool
	// MaxReplay bounds the claim's reply: a completed record larger than
	// this many bytes (encoded) is not sent, and Acquire returns a
	// *LargeRecordError with its size; the caller counts that much memory
	// and acquires again with MaxReplay at least that. 0: any size. (A
	// replay from the replay cache is shared, and returned whatever its
	// size.)
	MaxReplay int64
}

// LargeRecordError: the key's record is completed for this fingerprint,
// and is larger than Terms.MaxReplay; nothing of it was read.
type LargeRecordError struct {
	Size int64 // bytes the reply would carry
}

func (e *LargeRecordError) Error() string {
	return fmt.Sprintf("claim: completed record of %d bytes, above the reply's bound", e.Size)
}

var (
	claimScript    = redis.NewScript(scripts.Claim)
	completeScript = redis.NewScript(scripts.Complete)
	releaseScript  = redis.NewScript(scripts.Release)
)

// Op names what an Event reports.
type Op string

// The operations an Observer hears of.
const (
	OpClaim    Op = "claim"    // claim.lua
	OpComplete Op = "complete" // complete.lua (one event per attempt)
	OpRelease  Op = "release"  // release.lua (one event per attempt)
	OpHold     Op = "hold"     // complete.lua recording an unknown outcome (one event per attempt)
	OpCacheHit Op = "cache"    // a replay answered from the ReplayCache: no round trip
)

// Event is what an Observer is told of each operation: the script's status
// ("claimed", "takeover", "replay", "inflight", "mismatch", "ok",
// "recreated", "lost", "not_replicated", ...) or "error", and how long the
// round trip took (zero for OpCacheHit).
type Event struct {
	Op       Op
	Result   string
	Duration time.Duration
}

// Observer lets the caller export metrics without this package depending
// on a metrics library.
type Observer func(Event)

// CompleteBudget bounds Lease.Complete, its retries included. A graceful
// shutdown must leave this much time after the longest upstream call.
const CompleteBudget = 10 * time.Second

// completeAttempts: 50ms, 150ms, 450ms, then every second: about 5s of
// retries. go-redis, after failed dials, refuses calls for about a second
// before dialing again, so retries span seconds, not milliseconds.
const completeAttempts = 8

// AutoPipelineOptions are how the scripts are best pipelined when go-redis
// batches them automatically: its blocking-face defaults
// (DefaultBlockingAutoPipelineOptions) with batches of at most 100 commands
// instead of 300. go-redis takes every new batch queue from a pool of
// 100-command slices and allocates a fresh one when the batch size asks for
// more: 4.8 KB of garbage per flush, a sixth of all the proxy allocated per
// first request (allocation profile of make bench's unique workload). A
// batch holds one or two scripts per request in flight; the size is a soft
// bound, and a busier queue still flushes as one larger pipeline.
func AutoPipelineOptions() *redis.AutoPipelineOptions {
	o := redis.DefaultBlockingAutoPipelineOptions()
	o.MaxBatchSize = 100
	return o
}

// Store claims keys in one Redis (standalone, Sentinel or Cluster).
type Store struct {
	rdb          redis.Scripter
	prefix       string
	upstream     string // short hash of the upstream's identity; "" for none
	format       string // the scripts' form argument: "s" writes string records, "" hashes
	obs          Observer
	waitReplicas int
	waitTimeout  time.Duration
	cache        *replayCache
	cacheGated   bool         // the cache waits for WatchPurges (CacheAfterSubscribed)
	tracer       trace.Tracer // nil: no spans (see Tracing)
}

// Option configures a Store.
type Option func(*Store)

// WaitReplicas makes every claim and completion wait (Redis WAIT) until n
// replicas acknowledged it, at most timeout. A failover then cannot lose an
// acknowledged claim, at the cost of a replication round trip per write. A
// claim that is not acknowledged in time is released and reported as
// ErrNotReplicated; a completion that is not is logged by the caller
// (ErrNotReplicated wrapped), the answer having been given already.
func WaitReplicas(n int, timeout time.Duration) Option {
	return func(s *Store) { s.waitReplicas, s.waitTimeout = n, timeout }
}

// ReplayCache keeps completed records this process has replayed in memory,
// up to maxBytes in all, each for at most maxAge and never past its TTL in
// Redis. A completed record never changes, so a repeated replay is then
// answered without a Redis round trip. The price: a record deleted from
// Redis by hand is still replayed here for up to maxAge. maxBytes <= 0
// disables the cache.
func ReplayCache(maxBytes int, maxAge time.Duration) Option {
	return func(s *Store) {
		if maxBytes > 0 && maxAge > 0 {
			s.cache = newReplayCache(maxBytes, maxAge)
		}
	}
}

// CacheAfterSubscribed makes the ReplayCache serve and keep records only
// while WatchPurges holds a verified subscription to PurgeChannel (see
// WatchPurges): not before, and not from the moment it fails. A purge must
// reach the cache; one that may not is not trusted with replays.
func CacheAfterSubscribed() Option {
	return func(s *Store) { s.cacheGated = true }
}

// Upstream binds every record this Store writes to the upstream identified
// by id (UPSTREAM_ID): a key recorded in front of another upstream is never
// replayed here, nor executed again (ErrOtherUpstream). Only a hash of id is
// written. Records written without an upstream match any.
func Upstream(id string) Option {
	return func(s *Store) {
		if id != "" {
			h := sha256.Sum256([]byte(id))
			s.upstream = hex.EncodeToString(h[:8])
		}
	}
}

// StringRecords(true) makes the Store write each record as one string instead
// of a hash (RECORD_FORMAT=string): the same fields, encoded by the scripts, for
// fewer Redis commands per request. Every Store reads both forms, so replicas
// of either setting share one Redis; versions before this option existed
// cannot read string records, so it is for a fleet that runs this version
// everywhere.
func StringRecords(on bool) Option {
	return func(s *Store) {
		s.format = ""
		if on {
			s.format = "s"
		}
	}
}

// defaultFormat is the form a Store writes without the StringRecords option:
// hashes.
// Only this package's tests change it (CLAIM_TEST_RECORD_FORMAT=string, see
// format_test.go), to run every test of the package against string records.
var defaultFormat = ""

// NewStore returns a Store writing keys that start with prefix. obs may be nil.
func NewStore(rdb redis.Scripter, prefix string, obs Observer, opts ...Option) *Store {
	if obs == nil {
		obs = func(Event) {}
	}
	s := &Store{rdb: rdb, prefix: prefix, obs: obs, format: defaultFormat}
	for _, o := range opts {
		o(s)
	}
	if s.cacheGated && s.cache != nil {
		s.cache.off = true // until WatchPurges has verified its subscription
	}
	return s
}

// ReplayCacheOn reports whether the replay cache answers replays now: it is
// configured and, with CacheAfterSubscribed, its purge subscription is
// verified. While it is off, replays are read from Redis.
func (s *Store) ReplayCacheOn() bool {
	return s.cache != nil && !s.cache.isOff()
}

// Key identifies one (scope, idempotency key) pair. Only its hash is ever
// written to Redis or logs.
type Key [sha256.Size]byte

// NewKey hashes the scope values and the idempotency key. Each part is length
// prefixed, so ("ab","c") and ("a","bc") are different scopes.
func NewKey(scope []string, key string) Key {
	var stack [512]byte // typical scope and key fit: no allocation
	b := stack[:0]
	for _, s := range scope {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, 0xff) // separates scope from key even with zero scope values
	b = binary.LittleEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	return Key(sha256.Sum256(b))
}

// String is the hash in hex, as logged (key_hash) and as `idemproxy keys`
// takes it: never the key itself.
func (k Key) String() string {
	var buf [2 * sha256.Size]byte // one allocation, the string's; EncodeToString makes two
	hex.Encode(buf[:], k[:])
	return string(buf[:])
}

// Fingerprint is the SHA-256 of what makes two requests "the same".
type Fingerprint [sha256.Size]byte

// keys returns the one key every script of a claim touches: its record.
// claim.lua no longer declares the claim mark that versions before
// 2026-11-23 wrote beside an in-flight record: once every replica kept the
// lock deadline in the record and one TTL had passed there was no mark left
// to read, each first request paid a GET for it, and a declared key that is
// not there is refused (TRYAGAIN) while Redis Cluster migrates its slot.
func (s *Store) keys(k Key) []string {
	return []string{RecordKey(s.prefix, k)}
}

// RecordKey is the Redis key of k's record under prefix (KEY_PREFIX).
func RecordKey(prefix string, k Key) string {
	var buf [2 * sha256.Size]byte
	hex.Encode(buf[:], k[:])
	return prefix + "{" + string(buf[:]) + "}"
}

// Lease is a claim we hold. Exactly one of Complete, Hold or Release should
// be called; if none is, the claim's lock expires after its lock TTL and the
// next request takes it over (with Terms.Hold: finds its outcome unknown).
type Lease struct {
	store *Store
	keys  []string
	token string
	fp    Fingerprint // written with the record if the claim vanished before completion
	// TakenOver is true when an earlier claim of this key expired without
	// completing (its proxy died, or its outcome was unknown) and this lease
	// replaced it; TakeoverAge is the time since that earlier claim began.
	TakenOver   bool
	TakeoverAge time.Duration
	// Recreated is set by Complete or Hold when the claim was no longer in
	// Redis (lost in a failover, or purged) or its lock had expired (or it
	// was held as unknown), and nobody had claimed the key since: the
	// outcome was recorded all the same.
	Recreated bool
	// AlreadyUnknown is set by Hold when the key was unknown already under
	// this lease's token (a request found its lock expired and held it): the
	// unknown outcome is not a new one.
	AlreadyUnknown bool
}

// Acquire claims key for a request with fingerprint fp, or reports why not.
// It returns exactly one of:
//   - a Lease: the key was free (or its earlier claim's lock expired); forward the request;
//   - a Record: the key was completed for this fingerprint; replay it, then
//     Release it (one from the replay cache is held until then);
//   - ErrInFlight, ErrMismatch or ErrUnknown (test with errors.Is);
//   - another error: Redis could not be asked.
func (s *Store) Acquire(ctx context.Context, key Key, fp Fingerprint, terms Terms) (*Lease, *Record, error) {
	var gen uint64 // on a miss: a purge from now on keeps this read's replay out of the cache
	if s.cache != nil {
		cfp, rec, g, ok := s.cache.get(key)
		if ok {
			if cfp != fp {
				rec.Release()
				return nil, nil, ErrMismatch
			}
			s.obs(Event{Op: OpCacheHit, Result: "hit"})
			return nil, rec, nil
		}
		gen = g
	}
	token, err := newToken()
	if err != nil {
		return nil, nil, err
	}
	keys := s.keys(key)
	start := time.Now()
	hold := ""
	if terms.Hold {
		hold = "1"
	}
	maxReplay := ""
	if terms.MaxReplay > 0 {
		maxReplay = strconv.FormatInt(terms.MaxReplay, 10)
	}
	v, acked, err := s.run(ctx, claimScript, keys, token, fp[:], ms(terms.LockTTL), ms(max(terms.TTL, terms.LockTTL)), s.upstream, hold, s.format, maxReplay)
	status, args, err := decodeReply(v, err)
	if err == nil && (status == "claimed" || status == "takeover") && acked < s.waitReplicas {
		_ = s.newLease(keys, token, fp).releaseOnce(ctx) // best effort; the lock TTL frees it otherwise
		s.observe(ctx, Event{OpClaim, "not_replicated", time.Since(start)}, start)
		return nil, nil, fmt.Errorf("claim %s: %d of %d replicas acknowledged within %v: %w", key, acked, s.waitReplicas, s.waitTimeout, ErrNotReplicated)
	}
	s.observe(ctx, Event{OpClaim, resultLabel(status, err), time.Since(start)}, start)
	if err != nil {
		// The script may have run and only its reply been lost: free the
		// claim, or it would hold the key for its lock TTL and then count as
		// a takeover though nothing ran. In the background: against a
		// stalled Redis this takes a whole read timeout, and the caller's
		// answer (503, or a forward when failing open) must not wait for it.
		// go-redis's own timeouts end it.
		lease := s.newLease(keys, token, fp)
		go func() { _ = lease.releaseOnce(context.WithoutCancel(ctx)) }()
		return nil, nil, fmt.Errorf("claim %s: %w", key, err)
	}
	switch status {
	case "claimed":
		return s.newLease(keys, token, fp), nil, nil
	case "takeover":
		age, perr := strconv.ParseInt(args[0], 10, 64)
		if perr != nil {
			return nil, nil, fmt.Errorf("claim %s: bad takeover age %q: %w", key, args[0], perr)
		}
		lease := s.newLease(keys, token, fp)
		lease.TakenOver, lease.TakeoverAge = true, time.Duration(age)*time.Millisecond
		return lease, nil, nil
	case "replay":
		enc, perr := replayed(args)
		if perr != nil {
			return nil, nil, fmt.Errorf("claim %s: %w", key, perr)
		}
		rec, derr := DecodeRecord([]byte(enc))
		if derr != nil {
			return nil, nil, fmt.Errorf("claim %s: %w", key, derr)
		}
		rec.Trace = args[2]
		if s.cache != nil {
			if pttl, perr := strconv.ParseInt(args[1], 10, 64); perr == nil && pttl > 0 {
				// Redis measured the remaining TTL after we sent the claim:
				// counting from the send keeps the entry inside it.
				s.cache.put(key, fp, rec, len(enc), start.Add(time.Duration(pttl)*time.Millisecond), gen)
			}
		}
		return nil, rec, nil
	case "large":
		size, perr := strconv.ParseInt(args[0], 10, 64)
		if perr != nil || size <= terms.MaxReplay {
			return nil, nil, fmt.Errorf("claim %s: bad record size %q for a bound of %d: %w", key, args[0], terms.MaxReplay, ErrBadRecord)
		}
		return nil, nil, &LargeRecordError{Size: size}
	case "inflight":
		return nil, nil, ErrInFlight
	case "unknown":
		code, perr := strconv.Atoi(args[0])
		if perr != nil || code < 100 || code > 999 {
			return nil, nil, fmt.Errorf("claim %s: bad unknown status %q: %w", key, args[0], ErrBadRecord)
		}
		return nil, nil, &UnknownError{Status: code, Entered: args[1] == "held"}
	case "mismatch":
		return nil, nil, ErrMismatch
	case "otherupstream":
		return nil, nil, ErrOtherUpstream
	}
	return nil, nil, fmt.Errorf("claim %s: unexpected status %q", key, status)
}

// replayed is the encoded record of a "replay" reply: the whole of args[0],
// or, for a string record, args[0] from the 1-based position args[3] on
// (claim.lua hands over the record's string whole rather than copy the
// answer out of it inside Redis).
func replayed(args [4]string) (string, error) {
	if args[3] == "" {
		return args[0], nil
	}
	at, err := strconv.Atoi(args[3])
	if err != nil || at < 1 || at > len(args[0])+1 {
		return "", fmt.Errorf("bad replay offset %q in a string record of %d bytes: %w", args[3], len(args[0]), ErrBadRecord)
	}
	return args[0][at-1:], nil
}

func (s *Store) newLease(keys []string, token string, fp Fingerprint) *Lease {
	return &Lease{store: s, keys: keys, token: token, fp: fp}
}

// Complete records rec as the answer for the claimed key, kept for ttl, if the
// claim is still ours, or if it is gone and nobody claimed the key since
// (Recreated is then set). When another request has taken the key over it
// returns ErrLost and writes nothing: the key has then executed twice.
//
// The answer has been given by then, and losing its record would let a
// retry execute again: Complete retries on Redis errors, for up to
// CompleteBudget, on a context that ctx's cancellation does not reach.
// ErrNotReplicated (wrapped) means the record was written on the master but
// not acknowledged by enough replicas; nothing is retried then.
func (l *Lease) Complete(ctx context.Context, rec *Record, ttl time.Duration) error {
	return l.CompleteEncoded(ctx, rec.Encode(), rec.Trace, ttl)
}

// CompleteEncoded is Complete for a record already encoded (Record.Encode)
// with its Trace: a caller that holds the answer in a buffer of its own can
// let go of it once it is encoded, and count the encoding instead, which
// Redis may take up to CompleteBudget to accept.
func (l *Lease) CompleteEncoded(ctx context.Context, enc []byte, trace string, ttl time.Duration) error {
	// A copy: with the caller's string among the script's arguments,
	// escape analysis would count all that the caller's record points to
	// as escaping.
	tr := ""
	if isTraceContext(trace) {
		tr = strings.Clone(trace)
	}
	return l.record(ctx, enc, ttl, "c", tr)
}

// isTraceContext reports whether s is "<trace-id>-<span-id>" as Record.Trace
// says: 32 and 16 lower-case hex digits. Nothing else is stored, so a
// caller's free-form value can neither grow every record nor overflow a
// string record's one-byte field length.
func isTraceContext(s string) bool {
	if len(s) != 32+1+16 || s[32] != '-' {
		return false
	}
	for i := range len(s) {
		if c := s[i]; i != 32 && (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Hold records that the claim's outcome is unknown (Terms.Hold): its request
// was sent and the upstream timed out or broke off before a final status, so
// it may have executed. Requests with this key then get status (502, 504)
// without executing, for ttl or until an operator purges the key. It retries
// as Complete does; a real answer recorded by this lease is never replaced.
func (l *Lease) Hold(ctx context.Context, status int, ttl time.Duration) error {
	return l.record(ctx, []byte(strconv.Itoa(status)), ttl, "u", "")
}

func (l *Lease) record(ctx context.Context, enc []byte, ttl time.Duration, state, tr string) error {
	return l.retry(ctx, func(ctx context.Context) error { return l.completeOnce(ctx, enc, ttl, state, tr) })
}

// retry runs once until it succeeds or fails for good (ErrLost,
// ErrNotReplicated), completeAttempts times at most with a growing backoff,
// within CompleteBudget, on a context ctx's cancellation does not reach.
func (l *Lease) retry(ctx context.Context, once func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CompleteBudget)
	defer cancel()
	var err error
	backoff := 50 * time.Millisecond
	for attempt := range completeAttempts {
		if attempt > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			backoff = min(backoff*3, time.Second)
		}
		err = once(ctx)
		if err == nil || errors.Is(err, ErrLost) || errors.Is(err, ErrNotReplicated) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (l *Lease) completeOnce(ctx context.Context, enc []byte, ttl time.Duration, state, tr string) error {
	start := time.Now()
	v, acked, err := l.store.run(ctx, completeScript, l.keys[:1], l.token, enc, ms(ttl), l.fp[:], l.store.upstream, state, tr, l.store.format)
	op := OpComplete
	if state == "u" {
		op = OpHold
	}
	if err := l.finish(ctx, op, v, err, start); err != nil {
		return err
	}
	if acked < l.store.waitReplicas {
		return fmt.Errorf("complete %s: %d of %d replicas acknowledged within %v: %w", l.keys[0], acked, l.store.waitReplicas, l.store.waitTimeout, ErrNotReplicated)
	}
	return nil
}

// Release frees the claimed key so that the next request executes again, if
// the claim is still ours; otherwise it returns ErrLost and deletes nothing.
// It retries as Complete does, within CompleteBudget, on a context that
// ctx's cancellation does not reach: a release lost to a blip of Redis
// would leave the key in flight until its lock TTL (retries get 409), or,
// with Terms.Hold, make it unknown for an operator.
func (l *Lease) Release(ctx context.Context) error {
	return l.retry(ctx, l.releaseOnce)
}

func (l *Lease) releaseOnce(ctx context.Context) error {
	start := time.Now()
	v, err := releaseScript.Run(ctx, l.store.rdb, l.keys[:1], l.token).Result()
	return l.finish(ctx, OpRelease, v, err, start)
}

// run runs a script with EVALSHA, falling back to EVAL on NOSCRIPT. With
// WaitReplicas it sends WAIT in the same pipeline: WAIT counts the writes of
// its own connection, so it must follow the script on the connection that
// ran it (on Cluster, the connection to the key's master). It returns how
// many replicas acknowledged (0 without WaitReplicas).
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, int, error) {
	if s.waitReplicas <= 0 {
		v, err := script.Run(ctx, s.rdb, keys, args...).Result()
		return v, 0, err
	}
	var conn interface{ Pipeline() redis.Pipeliner }
	switch c := s.rdb.(type) {
	case interface {
		MasterForKey(context.Context, string) (*redis.Client, error)
	}:
		node, err := c.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, 0, fmt.Errorf("find master for %s: %w", keys[0], err)
		}
		conn = node
	case interface{ Pipeline() redis.Pipeliner }:
		conn = c
	default:
		return nil, 0, fmt.Errorf("WaitReplicas needs a pipelining client, not %T", s.rdb)
	}
	exec := func(eval func(redis.Pipeliner) *redis.Cmd) (*redis.Cmd, *redis.IntCmd, error) {
		pipe := conn.Pipeline()
		cmd := eval(pipe)
		wait := redis.NewIntCmd(ctx, "wait", s.waitReplicas, s.waitTimeout.Milliseconds())
		_ = pipe.Process(ctx, wait)
		_, err := pipe.Exec(ctx)
		return cmd, wait, err
	}
	cmd, wait, _ := exec(func(p redis.Pipeliner) *redis.Cmd { return script.EvalSha(ctx, p, keys, args...) })
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, wait, _ = exec(func(p redis.Pipeliner) *redis.Cmd { return script.Eval(ctx, p, keys, args...) })
	}
	v, err := cmd.Result()
	if err != nil {
		return nil, 0, err
	}
	acked, err := wait.Result()
	if err != nil {
		return nil, 0, fmt.Errorf("WAIT %d: %w", s.waitReplicas, err)
	}
	return v, int(acked), nil
}

func (l *Lease) finish(ctx context.Context, op Op, v any, err error, start time.Time) error {
	status, args, err := decodeReply(v, err)
	label := resultLabel(status, err)
	switch {
	case status == "ok" && (args[0] == "recreated" || args[0] == "late"):
		label = args[0]
		l.Recreated = true
	case status == "ok" && args[0] == "already":
		label = args[0]
		l.AlreadyUnknown = true
	}
	l.store.observe(ctx, Event{op, label, time.Since(start)}, start)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, l.keys[0], err)
	}
	switch status {
	case "ok":
		return nil
	case "lost":
		return ErrLost
	}
	return fmt.Errorf("%s %s: unexpected status %q", op, l.keys[0], status)
}

// decodeReply checks the shape of a script reply: an array of one to five
// strings, the first a status.
func decodeReply(v any, err error) (status string, args [4]string, _ error) {
	if err != nil {
		return "", args, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) < 1 || len(arr) > 5 {
		return "", args, fmt.Errorf("bad script reply %T %v", v, v)
	}
	if status, ok = arr[0].(string); !ok {
		return "", args, fmt.Errorf("bad script reply status %T", arr[0])
	}
	for i, a := range arr[1:] {
		if args[i], ok = a.(string); !ok {
			return "", args, fmt.Errorf("bad script reply argument %d: %T", i+1, a)
		}
	}
	return status, args, nil
}

func resultLabel(status string, err error) string {
	if err != nil {
		return "error"
	}
	return status
}

func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("claim token: %w", err)
	}
	return string(b[:]), nil
}

// Unavailable reports whether err means that Redis could not be asked: the
// network, a timeout, a closed client, a node that is loading, failing over
// or read-only (a replica after a failover), or a claim not acknowledged by
// enough replicas. A refusal by a Redis that answers (out of memory under
// noeviction, a script error) is not an outage: failing open on it would
// forward every request without a guarantee while Redis is up.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, ErrBadRecord) || errors.Is(err, ErrInFlight) || errors.Is(err, ErrMismatch) || errors.Is(err, ErrUnknown) {
		return false
	}
	if errors.Is(err, ErrNotReplicated) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true
}

// transientReplies are the error replies of a Redis that is (for a moment)
// not able to serve writes, as opposed to one refusing this write.
var transientReplies = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "READONLY", "TRYAGAIN", "BUSY ", "NOREPLICAS"}
