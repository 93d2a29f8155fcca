package claim

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/scripts"
)

// ErrNotFound: there is no record for the key (never claimed, expired,
// released or purged).
var ErrNotFound = errors.New("claim: no record")

var inspectScript = redis.NewScript(scripts.Inspect)

// State is where a key stands, as an operator reads it.
type State string

// The states of a record (its st field: i, c, u).
const (
	StateInFlight  State = "in_flight" // claimed, not completed yet
	StateCompleted State = "completed" // an answer is recorded and replayed
	StateUnknown   State = "unknown"   // the outcome is unknown (ON_UNKNOWN=hold); held until purged
)

// Entry is what an Inspector reads of one record. Times absent from the
// record are zero. It holds no token, key or scope value: the record has
// none in clear, and the token is never read.
type Entry struct {
	Key   Key
	State State
	// Status is the recorded status (completed) or the status a request
	// got when its outcome became unknown (502 or 504); 0 otherwise.
	Status        int
	Fingerprint   []byte
	ClaimedAt     time.Time
	CompletedAt   time.Time // completed, or entered the unknown state
	LockExpiresAt time.Time // in flight, when the record says
	// TTL is how long Redis keeps the record still; negative when it has
	// no expiry.
	TTL time.Duration
	// Upstream is the short hash of the upstream it was recorded in front of.
	Upstream string
	// Record is the recorded answer, when completed and read by Get.
	Record *Record
	// RecordBytes is the size of the encoded record (rec field).
	RecordBytes int
	// StringForm is true for a record kept as one string
	// (RECORD_FORMAT=string), false for a hash.
	StringForm bool
	// Trace is the execution's trace context, "<trace-id>-<span-id>" (field
	// tr; see Record.Trace), or "" (tracing off, not sampled, in flight).
	Trace string
}

// Inspector reads, lists and deletes records for an operator
// (`idemproxy keys`). It talks to Redis directly, outside any claim.
type Inspector struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewInspector returns an Inspector for the records under prefix
// (KEY_PREFIX). rdb may be a standalone, Sentinel or Cluster client.
func NewInspector(rdb redis.UniversalClient, prefix string) *Inspector {
	return &Inspector{rdb: rdb, prefix: prefix}
}

// ParseKeyHash parses the 64 hex digits of a key hash (as Key.String and
// the access log's key_hash write it; either case). Its error never quotes
// s: what an operator passes by mistake is likely the idempotency key
// itself, which must not end up in a terminal log.
func ParseKeyHash(s string) (Key, error) {
	var k Key
	if len(s) != 2*len(k) {
		return k, fmt.Errorf("key hash: want the 64 hex digits of key_hash, got %d characters (the key itself? keys hash prints its key_hash)", len(s))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, fmt.Errorf("key hash: not hexadecimal (%d characters; want the 64 hex digits of key_hash)", len(s))
	}
	return k, nil
}

// Get reads the record of k, body included. ErrNotFound when there is
// none; ErrBadRecord (wrapped) when it cannot be decoded.
func (in *Inspector) Get(ctx context.Context, k Key) (*Entry, error) {
	v, err := inspectScript.Run(ctx, in.rdb, []string{RecordKey(in.prefix, k)}, "body").Result()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k, err)
	}
	e, err := decodeInspect(k, v, true)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k, err)
	}
	return e, nil
}

// List walks every record with SCAN (on every master of a Cluster, one
// after the other), never KEYS, and calls fn with each, in no particular
// order, until fn returns false or the walk ends. Entries carry no Record
// (List does not move bodies), only the status. A record that does not
// decode is passed with a nil Entry and its error. count is SCAN's COUNT
// hint: the number of keys read per round trip.
func (in *Inspector) List(ctx context.Context, count int64, fn func(*Entry, Key, error) bool) error {
	nodes := []redis.UniversalClient{in.rdb}
	if cc, ok := in.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		nodes = nodes[:0]
		err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			nodes = append(nodes, c)
			mu.Unlock()
			return nil
		})
		if err != nil {
			return fmt.Errorf("list the cluster's masters: %w", err)
		}
	}
	match := globEscape(in.prefix) + "{*}"
	for _, node := range nodes {
		more, err := in.listNode(ctx, node, match, count, fn)
		if err != nil {
			return fmt.Errorf("scan %s: %w", nodeName(node), err)
		}
		if !more {
			return nil
		}
	}
	return nil
}

// listNode scans one node; for each SCAN page, the records are read in one
// pipelined round trip. It reports whether fn wants more.
func (in *Inspector) listNode(ctx context.Context, node redis.UniversalClient, match string, count int64, fn func(*Entry, Key, error) bool) (bool, error) {
	var cursor uint64
	for {
		names, next, err := node.Scan(ctx, cursor, match, count).Result()
		if err != nil {
			return false, err
		}
		var keys []Key
		var redisKeys []string
		for _, name := range names {
			if k, ok := in.parseRecordKey(name); ok {
				keys, redisKeys = append(keys, k), append(redisKeys, name)
			}
		}
		replies, err := inspectPage(ctx, node, redisKeys)
		if err != nil {
			return false, err
		}
		for i, k := range keys {
			v, err := replies[i].Result()
			var e *Entry
			if err == nil {
				e, err = decodeInspect(k, v, false)
			}
			if errors.Is(err, ErrNotFound) || errors.Is(err, errNotRecord) {
				continue // expired since the SCAN, or not ours
			}
			if !fn(e, k, err) {
				return false, nil
			}
		}
		if cursor = next; cursor == 0 {
			return true, nil
		}
	}
}

// inspectPage runs inspect.lua for every key in one pipeline: EVALSHA, and
// EVAL again if the node has not the script loaded.
func inspectPage(ctx context.Context, node redis.UniversalClient, keys []string) ([]*redis.Cmd, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	run := func(eval func(redis.Pipeliner, string) *redis.Cmd) ([]*redis.Cmd, error) {
		pipe := node.Pipeline()
		cmds := make([]*redis.Cmd, len(keys))
		for i, key := range keys {
			cmds[i] = eval(pipe, key)
		}
		_, err := pipe.Exec(ctx)
		if err != nil && !isReplyError(err) {
			return nil, err // the connection, not one key
		}
		return cmds, nil
	}
	cmds, err := run(func(p redis.Pipeliner, key string) *redis.Cmd {
		return inspectScript.EvalSha(ctx, p, []string{key}, "head")
	})
	if err != nil || !redis.HasErrorPrefix(cmds[0].Err(), "NOSCRIPT") {
		return cmds, err
	}
	return run(func(p redis.Pipeliner, key string) *redis.Cmd {
		return inspectScript.Eval(ctx, p, []string{key}, "head")
	})
}

func isReplyError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// parseRecordKey returns the key of a record's Redis key name, or false
// for any other name (a claim mark, another application's key).
func (in *Inspector) parseRecordKey(name string) (Key, bool) {
	rest, ok := strings.CutPrefix(name, in.prefix+"{")
	if !ok || len(rest) != 2*len(Key{})+1 || rest[len(rest)-1] != '}' {
		return Key{}, false
	}
	h := rest[:len(rest)-1]
	if strings.ToLower(h) != h {
		// Never written by a proxy (recordKey writes lower case), and a
		// key_hash printed for it would reach nothing: get and purge look
		// up the lower-case name.
		return Key{}, false
	}
	k, err := ParseKeyHash(h)
	return k, err == nil
}

// Purge deletes the record of k (one key: a claim mark that a version
// before 2026-11-23 left beside it is read by nothing, and a DEL naming it
// too would be refused while Redis Cluster migrates the slot), then
// announces the purge on PurgeChannel so that every replica drops k from its
// replay cache (see Store.WatchPurges). It reports whether there
// was anything to delete. The announcement is sent either way: a replica
// may still hold a record that Redis no longer has.
func (in *Inspector) Purge(ctx context.Context, k Key) (bool, error) {
	rec := RecordKey(in.prefix, k)
	n, err := in.rdb.Del(ctx, rec).Result()
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", k, err)
	}
	if _, err := in.Announce(ctx, k); err != nil {
		if n > 0 {
			return true, fmt.Errorf("deleted %s, but %w", k, err)
		}
		return false, fmt.Errorf("nothing to delete for %s, and %w", k, err)
	}
	return n > 0, nil
}

// ErrStateDiffers: PurgeIf found the record in another state than asked, or
// found none, and deleted nothing.
var ErrStateDiffers = errors.New("claim: the record is not in the state asked for")

// ErrClaimLive: PurgeIf(StateInFlight) found a claim whose lock is still
// running (or whose record has no lock deadline to judge by): a request
// holds the key, perhaps one that took it over since the operator looked.
var ErrClaimLive = errors.New("claim: the in-flight claim's lock is still running")

// PurgeIf is Purge only when the record of k is in state want, read and
// deleted in one optimistic transaction (WATCH, then MULTI/EXEC): a request
// that completes the key between an operator's `keys list` and the purge
// keeps its record. StateInFlight means an abandoned claim: one whose lock
// deadline has passed on Redis's clock (TIME); a live one, a takeover since
// the operator looked included, is refused with ErrClaimLive. It returns
// the state found ("" when there was no record) and whether it deleted the
// record; when the state is not want it deletes and announces nothing, and
// returns ErrStateDiffers. A record whose answer does not decode is judged
// by its state all the same. A record that changed during the transaction
// is read again (three times at most).
func (in *Inspector) PurgeIf(ctx context.Context, k Key, want State) (State, bool, error) {
	rec := RecordKey(in.prefix, k)
	var found State
	var lockEnds time.Time
	txn := func(tx *redis.Tx) error {
		found, lockEnds = "", time.Time{}
		v, err := inspectScript.Run(ctx, tx, []string{rec}, "").Result()
		if err != nil {
			return fmt.Errorf("read %s: %w", k, err)
		}
		e, err := decodeInspect(k, v, false)
		switch {
		case errors.Is(err, ErrNotFound):
			return ErrStateDiffers
		case err != nil && (e == nil || e.State == ""):
			return fmt.Errorf("read %s: %w", k, err)
		}
		found = e.State
		if found != want {
			return ErrStateDiffers
		}
		if want == StateInFlight {
			now, err := tx.Time(ctx).Result()
			if err != nil {
				return fmt.Errorf("read Redis's clock: %w", err)
			}
			if e.LockExpiresAt.IsZero() || now.Before(e.LockExpiresAt) {
				lockEnds = e.LockExpiresAt
				return ErrClaimLive
			}
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, rec)
			return nil
		})
		return err
	}
	var err error
	for range 3 {
		if err = in.rdb.Watch(ctx, txn, rec); !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	switch {
	case errors.Is(err, ErrStateDiffers):
		return found, false, err
	case errors.Is(err, ErrClaimLive):
		if lockEnds.IsZero() {
			return found, false, fmt.Errorf("%w (the record holds no lock deadline)", err)
		}
		return found, false, fmt.Errorf("%w (until %s)", err, lockEnds.Format("2006-01-02T15:04:05.000Z07:00"))
	case errors.Is(err, redis.TxFailedErr):
		return found, false, fmt.Errorf("delete %s: the record changed three times while it was being purged; nothing deleted: %w", k, err)
	case err != nil:
		return found, false, fmt.Errorf("delete %s: %w", k, err)
	}
	if _, err := in.Announce(ctx, k); err != nil {
		return found, true, fmt.Errorf("deleted %s, but %w", k, err)
	}
	return found, true, nil
}

// ErrNotAnnounced: a purge was not announced to the replicas' replay caches
// (the PUBLISH failed); errors.Is finds it in Announce's errors.
var ErrNotAnnounced = errors.New("claim: purge not announced")

type announceError struct {
	k       Key
	channel string
	err     error
}

func (e *announceError) Error() string {
	return fmt.Sprintf("could not announce the purge of %s to the replicas' replay caches (PUBLISH %s): %v", e.k, e.channel, e.err)
}
func (e *announceError) Unwrap() error        { return e.err }
func (e *announceError) Is(target error) bool { return target == ErrNotAnnounced }

// Announce publishes the purge of k on PurgeChannel, so that every replica
// drops k from its replay cache; it deletes nothing. Purge and PurgeIf
// announce what they delete; Announce alone is for telling the replicas
// again when that announcement failed, without deleting a record that a
// request may have written since. It returns how many subscribers the
// node that took the PUBLISH counted (on a Cluster, only that node's).
func (in *Inspector) Announce(ctx context.Context, k Key) (int64, error) {
	n, err := in.rdb.Publish(ctx, PurgeChannel(in.prefix), k.String()).Result()
	if err != nil {
		return 0, &announceError{k: k, channel: PurgeChannel(in.prefix), err: err}
	}
	return n, nil
}

// errNotRecord: the key is neither a hash nor a string record; not one of ours.
var errNotRecord = errors.New("claim: not a record")

// decodeInspect checks and decodes inspect.lua's reply. With body, the rec
// field is whole and a completed record is decoded into Entry.Record;
// without, only its status is read from its first bytes.
func decodeInspect(k Key, v any, body bool) (*Entry, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) < 1 {
		return nil, fmt.Errorf("bad inspect reply %T", v)
	}
	f := make([]string, len(arr))
	for i, a := range arr {
		if f[i], ok = a.(string); !ok {
			return nil, fmt.Errorf("bad inspect reply element %d: %T", i, a)
		}
	}
	switch {
	case f[0] == "none":
		return nil, ErrNotFound
	case len(f) == 1:
		return nil, fmt.Errorf("%w: a Redis %s that is not a record", errNotRecord, f[0])
	case f[0] != "hash" && f[0] != "string", len(f) != 11:
		return nil, fmt.Errorf("bad inspect reply: %d elements", len(f))
	}
	st, fp, at, ld, ct, up, rec := f[1], f[2], f[3], f[4], f[5], f[6], f[7]
	if st != "i" {
		ld = "" // the lock deadline stays in the record after it; it means nothing then
	}
	e := &Entry{Key: k, Fingerprint: []byte(fp), Upstream: up, Trace: f[10], StringForm: f[0] == "string"}
	var err error
	if e.RecordBytes, err = strconv.Atoi(f[8]); err != nil {
		return nil, fmt.Errorf("bad inspect reply length %q", f[8])
	}
	pttl, err := strconv.ParseInt(f[9], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad inspect reply pttl %q", f[9])
	}
	e.TTL = time.Duration(pttl) * time.Millisecond
	if pttl < 0 {
		e.TTL = -1
	}
	for _, t := range []struct {
		field, v string
		dst      *time.Time
	}{{"at", at, &e.ClaimedAt}, {"ld", ld, &e.LockExpiresAt}, {"ct", ct, &e.CompletedAt}} {
		if t.v == "" {
			continue
		}
		ms, err := strconv.ParseInt(t.v, 10, 64)
		if err != nil {
			return e, fmt.Errorf("%w: field %s is %q, not milliseconds", errBadRecord, t.field, t.v)
		}
		*t.dst = time.UnixMilli(ms).UTC()
	}
	switch st {
	case "i":
		e.State = StateInFlight
	case "c":
		e.State = StateCompleted
		if body {
			if e.Record, err = DecodeRecord([]byte(rec)); err != nil {
				return e, err
			}
			e.Status = e.Record.Status
		} else if e.Status, err = recordStatus([]byte(rec)); err != nil {
			return e, err
		}
	case "u":
		e.State = StateUnknown
		if rec == "" {
			break // no status recorded: nothing more to say
		}
		if e.Status, err = strconv.Atoi(rec); err != nil || e.Status < 100 || e.Status > 999 {
			return e, fmt.Errorf("%w: unknown state with status %q", errBadRecord, rec)
		}
	case "":
		return e, fmt.Errorf("%w: no state field", errBadRecord)
	default:
		return e, fmt.Errorf("%w: state %q", errBadRecord, st)
	}
	return e, nil
}

// recordStatus reads the status from the first bytes of an encoded record
// (see Encode): magic, version, flags, uvarint status.
func recordStatus(head []byte) (int, error) {
	if len(head) < 4 || head[0] != recordMagic || head[1] != recordVersion {
		return 0, fmt.Errorf("%w: bad header", errBadRecord)
	}
	status, n := binary.Uvarint(head[3:])
	if n <= 0 || status < 100 || status > 999 {
		return 0, fmt.Errorf("%w: bad status", errBadRecord)
	}
	return int(status), nil
}

// globEscape quotes the characters SCAN's MATCH pattern gives a meaning.
// Byte by byte: KEY_PREFIX need not be UTF-8, and Redis matches bytes.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func nodeName(c redis.UniversalClient) string {
	if cl, ok := c.(*redis.Client); ok {
		return cl.Options().Addr
	}
	return "Redis"
}
