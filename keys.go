package main

// idemproxy keys: operator commands on the records in Redis (README
// "Operator commands: idemproxy keys"). They read the proxy's environment,
// UPSTREAM_URL excepted, and talk to Redis directly.

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

const keysUsage = `Usage: idemproxy keys COMMAND [flags] [args]

Operator commands on the records the proxies keep in Redis. They read the
proxy's environment (REDIS_*, KEY_PREFIX, IDEMPOTENCY_HEADER, SCOPE_HEADERS,
MAX_KEY_LENGTH; UPSTREAM_URL is not needed) and need a shared Redis: with
REDIS_MODE=standalone, REDIS_URL must be set.

Commands:
  hash [--source SOURCE] [--scope NAME=VALUE]... PART...
                           print the key_hash the proxy logs for a key
  get KEY_HASH [--body]    print one record as JSON; --body: its raw body only
  list [--state STATE] [--limit N]
                           print records as NDJSON, one a line (SCAN, never KEYS)
  purge KEY_HASH [--state STATE]
                           delete a record: the next request with its key executes
  forget KEY_HASH          tell every proxy to drop it from its replay cache again
                           (after a purge that could not); deletes nothing

KEY_HASH is the 64 hex digits of key_hash in the access log. Exit status: 0
done, 1 failure (Redis unreachable, no such record), 2 usage error.
Run idemproxy keys COMMAND --help for a command's flags.
`

var keysCommandUsage = map[string]string{
	"hash": `Usage: idemproxy keys hash [--source SOURCE] [--scope NAME=VALUE]... [--route-scope H1,H2] PART...

Prints the key_hash (64 hex digits) that the proxy logs for a request, so
that its record can be found with get or purge. Nothing is read from Redis.

Without --source, PART is one key as sent in IDEMPOTENCY_HEADER (a quoted
structured-field string is unquoted, as the proxy does). With --source, the
route's key=SOURCE as written (a preset such as github or cloudevents, or an
expression such as header:X-A+json:/id), and the PARTs are the values of one
alternative's parts, in order (a ce-* header's value percent-decoded, as in
a structured CloudEvent). On a verify= route of github or shopify, whose
keys also hold the SHA-256 of the delivery's body, give it with
--body-sha256.

--scope gives the value of a scope header, once per header (a header sent
more than once: repeat it, values in order); the names are those of
SCOPE_HEADERS, or of the route's scope= list given with --route-scope
(--route-scope= for a route with scope= empty). An unnamed scope header is
absent (""). A PART starting with "-" goes after "--".

Flags:
`,
	"get": `Usage: idemproxy keys get KEY_HASH [--body] [--show-secrets]

Prints the record of KEY_HASH as one JSON object: key_hash, state
(in_flight, completed, unknown), status, fingerprint (hex), claimed_at,
completed_at, lock_expires_at, ttl_ms, body_bytes, body_stored, headers.
Never the key, the scope values or the claim token; recorded Set-Cookie
values only with --show-secrets. With --body, writes the recorded body only,
byte for byte. No record: exit status 1.

Flags:
`,
	"list": `Usage: idemproxy keys list [--state in_flight|completed|unknown] [--limit N]

Prints one JSON object a line for each record (key_hash, state, status,
ttl_ms, claimed_at, completed_at), walking Redis with SCAN (every master of
a Cluster), never KEYS, in no particular order, and stops after --limit.

Flags:
`,
	"purge": `Usage: idemproxy keys purge KEY_HASH [--state in_flight|completed|unknown]

Deletes the record of KEY_HASH, and tells every running
proxy to drop it from its replay cache (Pub/Sub on KEY_PREFIX + "purge"):
the next request with that key executes. Prints {"key_hash":...,"purged":true};
purged is false, with a note on stderr, when nothing was there (exit 0).

With --state, only a record in that state is deleted, read and deleted in
one transaction: a key that completed since you looked keeps its record.
in_flight means abandoned: its lock deadline has passed (a live claim, a
takeover since you looked included, is refused). Otherwise nothing is
deleted, it prints {"key_hash":...,"purged":false,"state":...} (the state
found, "" for no record) and exits 1.

If the record was deleted but the proxies could not be told (exit 1, "could
not announce"), do not purge again: a request may have executed and been
recorded since. Run keys forget KEY_HASH.

Flags:
`,
	"forget": `Usage: idemproxy keys forget KEY_HASH

Tells every running proxy to drop KEY_HASH from its replay cache, as purge
does after deleting (Pub/Sub on KEY_PREFIX + "purge"; with Sentinel on every
data node), and deletes nothing in Redis. For a purge that deleted the
record but could not announce it: running purge again would delete the
answer of a request that executed since. Prints
{"key_hash":...,"announced":true}; exit 1 when the announcement fails.

Flags:
`,
}

// runKeys runs `idemproxy keys ARGS...`.
func runKeys(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return keysBadUsage(stderr, keysUsage, errors.New("keys: a command is needed"))
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, keysUsage)
		return nil
	}
	usage, ok := keysCommandUsage[cmd]
	if !ok {
		// Not echoed: a key pasted in the wrong place must not reach the
		// terminal, its scroll-back or a CI log.
		return keysBadUsage(stderr, keysUsage, fmt.Errorf("keys: unknown command (an argument of %d characters, not shown; want hash, get, list, purge or forget)", len(cmd)))
	}
	kc := &keysCmd{name: cmd, stdout: stdout, stderr: stderr, fs: flag.NewFlagSet("keys "+cmd, flag.ContinueOnError)}
	kc.fs.SetOutput(io.Discard)
	kc.fs.DurationVar(&kc.timeout, "timeout", 30*time.Second, "give up after this long")
	var run func(context.Context, []string) error
	switch cmd {
	case "hash":
		run = kc.hashFlags()
	case "get":
		run = kc.getFlags()
	case "list":
		run = kc.listFlags()
	case "purge":
		run = kc.purgeFlags()
	case "forget":
		run = kc.forgetFlags()
	}
	pos, err := parseInterleaved(kc.fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage+kc.flagDefaults())
		return nil
	}
	if err != nil {
		return kc.badUsage(err)
	}
	if kc.timeout <= 0 {
		return kc.badUsage(fmt.Errorf("--timeout=%v: must be above zero", kc.timeout))
	}
	ctx, cancel := context.WithTimeout(ctx, kc.timeout)
	defer cancel()
	kc.environ = environ
	err = run(ctx, pos)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (gave up after --timeout=%v)", err, kc.timeout)
	}
	return err
}

// keysCmd is one `idemproxy keys` command being run.
type keysCmd struct {
	name           string
	fs             *flag.FlagSet
	timeout        time.Duration
	environ        []string
	stdout, stderr io.Writer
	cfg            *Config
}

func (kc *keysCmd) flagDefaults() string {
	var b strings.Builder
	kc.fs.SetOutput(&b)
	kc.fs.PrintDefaults()
	kc.fs.SetOutput(io.Discard)
	return b.String()
}

func (kc *keysCmd) badUsage(err error) error {
	return keysBadUsage(kc.stderr, keysCommandUsage[kc.name]+kc.flagDefaults(), fmt.Errorf("keys %s: %w", kc.name, err))
}

func keysBadUsage(stderr io.Writer, usage string, err error) error {
	fmt.Fprintf(stderr, "idemproxy: %v\n%s", err, usage)
	return usageError{err}
}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments (keys get HASH --body), and returns the positional
// ones. Everything after "--" is positional.
//
// An argument that starts with "-" and names no flag is refused without
// being shown: the flag package's own error quotes it, and it is likely a
// key (a base64url key starts with "-" once in 64) that belongs after "--".
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := undefinedFlag(fs, args); err != nil {
			return nil, err
		}
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// undefinedFlag finds the first argument fs.Parse would take for a flag it
// does not define, up to the first positional argument or "--".
func undefinedFlag(fs *flag.FlagSet, args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return nil
		}
		name, _, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		f := fs.Lookup(name)
		switch {
		case f == nil && (name == "h" || name == "help"):
		case f == nil:
			return fmt.Errorf("an argument of %d characters (not shown: it may be a key) starts with - but is none of the flags below; a PART or KEY_HASH that starts with - goes after --", len(a))
		case !hasValue && !isBoolFlag(f):
			i++ // its value, whatever it looks like
		}
	}
	return nil
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// config loads the proxy's configuration without UPSTREAM_URL, which no
// command needs: a placeholder stands in for it, so that the same parsing
// and checks apply as in the proxy (config.go is not changed for keys).
func (kc *keysCmd) config() (*Config, error) {
	if kc.cfg != nil {
		return kc.cfg, nil
	}
	environ := append(kc.environ[:len(kc.environ):len(kc.environ)], "UPSTREAM_URL=http://upstream.invalid", "UPSTREAM_ID=")
	cfg, err := loadKeysConfig(environ)
	if err != nil {
		return nil, err
	}
	kc.cfg = cfg
	return cfg, nil
}

// inspector connects to the proxies' Redis. It returns how to close it.
func (kc *keysCmd) inspector() (*claim.Inspector, func(), error) {
	cfg, err := kc.config()
	if err != nil {
		return nil, nil, err
	}
	if cfg.RedisMode == "standalone" && cfg.RedisURL == "" {
		return nil, nil, errors.New("REDIS_URL is empty: keys needs the Redis the proxies use (with REDIS_URL empty each proxy runs its own embedded Redis, which no other process can reach)")
	}
	// go-redis's own complaints (a pool that cannot dial) would repeat the
	// error this command reports; only worse ones get through.
	st, err := openRedisBounded(cfg, zerolog.New(kc.stderr).Level(zerolog.ErrorLevel), kc.timeout, nil)
	if err != nil {
		return nil, nil, err
	}
	return claim.NewInspector(st.client, cfg.KeyPrefix), st.close, nil
}

// redisFailed names the Redis that failed and how it is configured.
func (kc *keysCmd) redisFailed(err error) error {
	cfg := kc.cfg
	where := fmt.Sprintf("REDIS_URL=%q", redactURL(cfg.RedisURL))
	if cfg.RedisMode != "standalone" {
		where = fmt.Sprintf("REDIS_MODE=%s REDIS_ADDRS=%q", cfg.RedisMode, strings.Join(cfg.RedisAddrs, ","))
	}
	if cfg.RedisMode == "sentinel" {
		// The command's own deadline has passed by now: the sentinels get
		// a short one of their own (explainSentinel bounds it to 2s).
		ctx, cancel := context.WithTimeout(context.Background(), min(kc.timeout, 2*time.Second))
		defer cancel()
		if e := explainSentinel(ctx, cfg, err); e != err { //nolint:errorlint // identity: explained or not
			return fmt.Errorf("keys %s: %w", kc.name, e)
		}
	}
	return fmt.Errorf("keys %s: Redis (%s): %w", kc.name, where, err)
}

// openKey reads the one KEY_HASH argument of get, purge and forget, then
// connects.
func (kc *keysCmd) openKey(pos []string) (claim.Key, *claim.Inspector, func(), error) {
	k, err := kc.keyHash(pos)
	if err != nil {
		return k, nil, nil, err
	}
	in, closeRedis, err := kc.inspector()
	return k, in, closeRedis, err
}

func (kc *keysCmd) keyHash(pos []string) (claim.Key, error) {
	if len(pos) != 1 {
		return claim.Key{}, kc.badUsage(fmt.Errorf("want one KEY_HASH, got %d arguments", len(pos)))
	}
	k, err := claim.ParseKeyHash(pos[0])
	if err != nil {
		return k, kc.badUsage(err)
	}
	return k, nil
}

// scopeFlag collects --scope NAME=VALUE. A malformed one is not refused by
// Set, whose error the flag package prints with the value (a credential,
// likely): it is kept in err, which names no value, and reported after
// parsing.
type scopeFlag struct {
	pairs [][2]string
	err   error
}

func (s *scopeFlag) String() string { return "" }
func (s *scopeFlag) Set(v string) error {
	name, val, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		if s.err == nil {
			s.err = fmt.Errorf("--scope #%d: want NAME=VALUE (a scope header's name, \"=\", its value), got %d characters without a name", len(s.pairs)+1, len(v))
		}
		return nil
	}
	s.pairs = append(s.pairs, [2]string{name, val})
	return nil
}

func (kc *keysCmd) hashFlags() func(context.Context, []string) error {
	source := kc.fs.String("source", "", "the route's key=SOURCE, as written (preset or expression)")
	bodySum := kc.fs.String("body-sha256", "", "with --source github or shopify on a verify= route: the SHA-256 of the delivery's body, in hex (such keys are bound to the body)")
	var scope scopeFlag
	kc.fs.Var(&scope, "scope", "NAME=VALUE: a scope header's value (repeat for each header)")
	var routeScope *[]string
	kc.fs.Func("route-scope", "H1,H2: the route's scope= header names, instead of SCOPE_HEADERS", func(v string) error {
		names := []string{}
		if v != "" {
			for n := range strings.SplitSeq(v, ",") {
				names = append(names, strings.TrimSpace(n))
			}
		}
		routeScope = &names
		return nil
	})
	return func(_ context.Context, parts []string) error {
		if scope.err != nil {
			return kc.badUsage(scope.err)
		}
		cfg, err := kc.config()
		if err != nil {
			return err
		}
		names := cfg.ScopeHeaders
		if routeScope != nil {
			names = *routeScope
		}
		// The --scope pairs become the request's header, in order, and the
		// proxy's own code reads the values out of it: a repeated header
		// (an empty value included) and a name listed twice come out as in
		// the access log.
		header, host, hostSet := http.Header{}, "", false
		for _, p := range scope.pairs {
			if indexFold(names, p[0]) < 0 {
				from := fmt.Sprintf("SCOPE_HEADERS=%q", strings.Join(names, ","))
				if routeScope != nil {
					from = fmt.Sprintf("--route-scope=%q", strings.Join(names, ","))
				}
				return kc.badUsage(fmt.Errorf("--scope %s: not a scope header (%s)", p[0], from))
			}
			if strings.EqualFold(p[0], "Host") {
				if hostSet {
					return kc.badUsage(errors.New("--scope Host: given twice; a request has one Host"))
				}
				host, hostSet = p[1], true
				continue
			}
			header.Add(p[0], p[1])
		}
		values := proxy.ScopeValues(header, host, names, nil)
		var key string
		if *source == "" {
			if len(parts) != 1 {
				return kc.badUsage(fmt.Errorf("want one PART (the %s value as sent), got %d; for a key=SOURCE route give --source", cfg.IdempotencyHeader, len(parts)))
			}
			if key, err = proxy.HeaderKey(parts[0], cfg.MaxKeyLength); err != nil {
				return kc.badUsage(fmt.Errorf("the proxy refuses this %s: %w", cfg.IdempotencyHeader, err))
			}
		} else {
			ks, err := proxy.ParseKeySource(*source)
			if err != nil {
				return kc.badUsage(fmt.Errorf("--source=%s: %w", *source, err))
			}
			if *bodySum != "" {
				if sum, err := hex.DecodeString(*bodySum); err != nil || len(sum) != 32 {
					return kc.badUsage(errors.New("--body-sha256: want the 64 hex digits of a SHA-256"))
				}
				ks = ks.BindBody()
				parts = append(parts, strings.ToLower(*bodySum))
			}
			values := parts
			if ks.BodyBound() {
				values = parts[:len(parts)-1] // the digest is checked above
			}
			for i, p := range values {
				if p == "" || len(p) > cfg.MaxKeyLength {
					return kc.badUsage(fmt.Errorf("PART %d is %d bytes; the proxy takes 1 to MAX_KEY_LENGTH=%d", i+1, len(p), cfg.MaxKeyLength))
				}
			}
			if key, err = ks.Key(parts); err != nil {
				return kc.badUsage(err)
			}
		}
		fmt.Fprintln(kc.stdout, claim.NewKey(values, key).String())
		return nil
	}
}

func indexFold(names []string, name string) int {
	for i, n := range names {
		if strings.EqualFold(strings.TrimSpace(n), name) {
			return i
		}
	}
	return -1
}

// keyJSON is what get and list print of a record. It has no field for the
// token, the key or a scope value.
type keyJSON struct {
	KeyHash       string               `json:"key_hash"`
	State         claim.State          `json:"state,omitempty"`
	Status        int                  `json:"status,omitempty"`
	Fingerprint   string               `json:"fingerprint,omitempty"`
	ClaimedAt     string               `json:"claimed_at,omitempty"`
	CompletedAt   string               `json:"completed_at,omitempty"`
	LockExpiresAt string               `json:"lock_expires_at,omitempty"`
	TTLms         int64                `json:"ttl_ms"`
	Upstream      string               `json:"upstream,omitempty"`
	BodyBytes     *int                 `json:"body_bytes,omitempty"`
	BodyStored    *bool                `json:"body_stored,omitempty"`
	Headers       *map[string][]string `json:"headers,omitempty"`
	Trailers      map[string][]string  `json:"trailers,omitempty"`
	// Trace is the execution's "<trace-id>-<span-id>" (record field tr).
	Trace string `json:"trace,omitempty"`
	// Format is "string" for a record kept as one string
	// (RECORD_FORMAT=string); absent for a hash.
	Format string `json:"format,omitempty"`
	Error  string `json:"error,omitempty"`
}

func newKeyJSON(k claim.Key, e *claim.Entry) keyJSON {
	j := keyJSON{KeyHash: k.String(), TTLms: -2}
	if e == nil {
		return j
	}
	j.State, j.Status, j.Upstream, j.Trace = e.State, e.Status, e.Upstream, e.Trace
	if e.StringForm {
		j.Format = "string"
	}
	j.Fingerprint = hex.EncodeToString(e.Fingerprint)
	j.ClaimedAt, j.CompletedAt, j.LockExpiresAt = jsonTime(e.ClaimedAt), jsonTime(e.CompletedAt), jsonTime(e.LockExpiresAt)
	j.TTLms = e.TTL.Milliseconds()
	if e.TTL < 0 {
		j.TTLms = -1
	}
	if r := e.Record; r != nil {
		n, stored := len(r.Body), !r.BodyNotStored
		h := r.Header
		if h == nil {
			h = map[string][]string{}
		}
		j.BodyBytes, j.BodyStored, j.Headers, j.Trailers = &n, &stored, &h, r.Trailer
	}
	return j
}

// secretHeaders are recorded answer headers whose values are credentials
// of the caller (a session cookie): keys get shows their size, not their
// value, unless --show-secrets asks for it.
var secretHeaders = []string{"Set-Cookie", "Set-Cookie2"}

// maskSecrets replaces the values of secretHeaders in j's headers and
// trailers (copies: the record is not changed).
func (j *keyJSON) maskSecrets() {
	mask := func(h map[string][]string) map[string][]string {
		var out map[string][]string
		for name, vv := range h {
			if !slices.ContainsFunc(secretHeaders, func(s string) bool { return strings.EqualFold(s, name) }) {
				continue
			}
			if out == nil {
				out = maps.Clone(h)
			}
			masked := make([]string, len(vv))
			for i, v := range vv {
				masked[i] = fmt.Sprintf("(%d bytes, not shown; --show-secrets shows it)", len(v))
			}
			out[name] = masked
		}
		if out == nil {
			return h
		}
		return out
	}
	if j.Headers != nil {
		h := mask(*j.Headers)
		j.Headers = &h
	}
	j.Trailers = mask(j.Trailers)
}

func jsonTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// writeJSON writes v as one line of JSON. Header values come from the
// upstream and go to an operator's terminal: encoding/json escapes the C0
// controls but not DEL nor the C1 controls (U+0080-U+009F: CSI, OSC...),
// which some terminals execute; those are escaped too (\u009b), which any
// JSON reader decodes to the same string.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(escapeControls(buf.Bytes()))
	return err
}

// escapeControls rewrites U+007F-U+009F in encoding/json's output (valid
// UTF-8, where they can only be inside strings) as \u00XX escapes.
func escapeControls(b []byte) []byte {
	const hexDigits = "0123456789abcdef"
	var out []byte
	last := 0
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r >= 0x7f && r <= 0x9f {
			if out == nil {
				out = make([]byte, 0, len(b)+16)
			}
			out = append(out, b[last:i]...)
			out = append(out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
			last = i + n
		}
		i += n
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

func (kc *keysCmd) getFlags() func(context.Context, []string) error {
	body := kc.fs.Bool("body", false, "write the recorded body only, byte for byte")
	showSecrets := kc.fs.Bool("show-secrets", false, "show the values of recorded Set-Cookie headers (masked otherwise: they are the caller's credentials)")
	return func(ctx context.Context, pos []string) error {
		k, in, closeRedis, err := kc.openKey(pos)
		if err != nil {
			return err
		}
		defer closeRedis()
		e, err := in.Get(ctx, k)
		switch {
		case errors.Is(err, claim.ErrNotFound):
			return fmt.Errorf("no record for key_hash %s (never claimed, expired, released or purged; KEY_PREFIX=%q)", k, kc.cfg.KeyPrefix)
		case errors.Is(err, claim.ErrBadRecord):
			return fmt.Errorf("the record of key_hash %s cannot be decoded (written by an incompatible version, or damaged): %w; idemproxy keys purge removes it", k, err)
		case err != nil:
			return kc.redisFailed(err)
		}
		if !*body {
			j := newKeyJSON(k, e)
			if !*showSecrets {
				j.maskSecrets()
			}
			return writeJSON(kc.stdout, j)
		}
		switch {
		case e.Record == nil:
			return fmt.Errorf("key_hash %s is %s: it has no recorded body", k, e.State)
		case e.Record.BodyNotStored:
			return fmt.Errorf("key_hash %s: the body of its %d answer was too large to store (MAX_STORED_RESPONSE_BYTES) and was not recorded", k, e.Status)
		}
		_, err = kc.stdout.Write(e.Record.Body)
		return err
	}
}

func (kc *keysCmd) listFlags() func(context.Context, []string) error {
	state := kc.fs.String("state", "", "only records in this state: in_flight, completed or unknown")
	limit := kc.fs.Int("limit", 100, "stop after this many records (1 to 100000)")
	return func(ctx context.Context, pos []string) error {
		switch claim.State(*state) {
		case "", claim.StateInFlight, claim.StateCompleted, claim.StateUnknown:
		default:
			return kc.badUsage(fmt.Errorf("--state=%q: want in_flight, completed or unknown", *state))
		}
		if *limit < 1 || *limit > 100000 {
			return kc.badUsage(fmt.Errorf("--limit=%d: want 1 to 100000", *limit))
		}
		if len(pos) > 0 {
			return kc.badUsage(fmt.Errorf("%d unexpected arguments (list takes none)", len(pos)))
		}
		in, closeRedis, err := kc.inspector()
		if err != nil {
			return err
		}
		defer closeRedis()
		n := 0
		var werr error
		err = in.List(ctx, 500, func(e *claim.Entry, k claim.Key, derr error) bool {
			// A record whose answer does not decode still has its state: an
			// operator looking for completed or unknown keys must see it.
			if *state != "" && (e == nil || e.State != claim.State(*state)) {
				return true
			}
			j := newKeyJSON(k, e)
			j.maskSecrets() // get --show-secrets shows them, one key at a time
			if derr != nil {
				j.Error = derr.Error()
			}
			if werr = writeJSON(kc.stdout, j); werr != nil {
				return false
			}
			n++
			return n < *limit
		})
		if err != nil {
			return kc.redisFailed(err)
		}
		if werr != nil {
			return werr
		}
		if n == *limit {
			fmt.Fprintf(kc.stderr, "idemproxy keys list: stopped at --limit=%d; there may be more\n", *limit)
		}
		return nil
	}
}

func (kc *keysCmd) purgeFlags() func(context.Context, []string) error {
	state := kc.fs.String("state", "", "delete only a record in this state: in_flight, completed or unknown")
	return func(ctx context.Context, pos []string) error {
		given := false
		kc.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "state" })
		switch claim.State(*state) {
		case claim.StateInFlight, claim.StateCompleted, claim.StateUnknown:
		case "":
			if given { // an unset variable in a script must not purge unchecked
				return kc.badUsage(errors.New(`--state="": want in_flight, completed or unknown (leave --state out to delete whatever is there)`))
			}
		default:
			return kc.badUsage(fmt.Errorf("--state=%q: want in_flight, completed or unknown", *state))
		}
		k, in, closeRedis, err := kc.openKey(pos)
		if err != nil {
			return err
		}
		defer closeRedis()
		var purged bool
		if *state != "" {
			var found claim.State
			found, purged, err = in.PurgeIf(ctx, k, claim.State(*state))
			if errors.Is(err, claim.ErrStateDiffers) || errors.Is(err, claim.ErrClaimLive) {
				_ = writeJSON(kc.stdout, struct {
					KeyHash string      `json:"key_hash"`
					Purged  bool        `json:"purged"`
					State   claim.State `json:"state"`
				}{k.String(), false, found})
				switch {
				case errors.Is(err, claim.ErrClaimLive):
					return fmt.Errorf("key_hash %s not purged: it is in flight, but not abandoned: %w; a request holds it (perhaps one that took it over since you looked); plain keys purge deletes it all the same", k, err)
				case found == "":
					return fmt.Errorf("key_hash %s not purged: no record (never claimed, expired, released or purged; KEY_PREFIX=%q), not --state=%s; if a purge of it could not announce itself, keys forget %s tells the replicas", k, kc.cfg.KeyPrefix, *state, k)
				}
				return fmt.Errorf("key_hash %s not purged: its record is %s, not --state=%s", k, found, *state)
			}
		} else {
			purged, err = in.Purge(ctx, k)
		}
		switch {
		case err != nil && purged:
			_ = writeJSON(kc.stdout, map[string]any{"key_hash": k.String(), "purged": true})
			// Not purge again: a request may have executed and recorded an
			// answer since, which it would delete.
			return fmt.Errorf("%w; idemproxy keys forget %s tells the replicas again and deletes nothing", kc.redisFailed(err), k)
		case errors.Is(err, claim.ErrNotAnnounced):
			_ = writeJSON(kc.stdout, map[string]any{"key_hash": k.String(), "purged": false})
			return fmt.Errorf("%w; if an earlier purge deleted it, idemproxy keys forget %s tells the replicas", kc.redisFailed(err), k)
		case err != nil:
			// The delete may have run and only its answer been lost.
			return fmt.Errorf("%w; the delete may have run all the same: idemproxy keys get %s still shows the record if it did not (purge again then), and if it did, idemproxy keys forget %s tells the replicas, which were not told", kc.redisFailed(err), k, k)
		}
		if kc.cfg.RedisMode == "sentinel" {
			kc.announceOnEveryNode(ctx, k)
		}
		if !purged {
			fmt.Fprintf(kc.stderr, "idemproxy keys purge: nothing was there for key_hash %s (KEY_PREFIX=%q); the replicas were told to forget it all the same\n", k, kc.cfg.KeyPrefix)
		}
		return writeJSON(kc.stdout, struct {
			KeyHash string `json:"key_hash"`
			Purged  bool   `json:"purged"`
		}{k.String(), purged})
	}
}

func (kc *keysCmd) forgetFlags() func(context.Context, []string) error {
	return func(ctx context.Context, pos []string) error {
		k, in, closeRedis, err := kc.openKey(pos)
		if err != nil {
			return err
		}
		defer closeRedis()
		heard, err := in.Announce(ctx, k)
		if err != nil {
			return kc.redisFailed(err)
		}
		if heard == 0 && kc.cfg.RedisMode != "cluster" { // (a Cluster node counts only its own subscribers)
			fmt.Fprintf(kc.stderr, "idemproxy keys forget: no proxy is subscribed to %s on this Redis: check that KEY_PREFIX=%q and the Redis are the proxies'\n", claim.PurgeChannel(kc.cfg.KeyPrefix), kc.cfg.KeyPrefix)
		}
		if kc.cfg.RedisMode == "sentinel" {
			kc.announceOnEveryNode(ctx, k)
		}
		return writeJSON(kc.stdout, struct {
			KeyHash   string `json:"key_hash"`
			Announced bool   `json:"announced"`
		}{k.String(), true})
	}
}

// purgeWatchStopWait bounds how long closing the store waits for the purge
// watch to stop. A healthy one stops at once; one whose Redis stalls is
// stuck in go-redis's redial and handshake (the PubSub's lock is held for a
// dial and read timeout, 5 s and more each time), and waiting for it would
// hold shutdown past SHUTDOWN_TIMEOUT. It is then left to end by itself.
const purgeWatchStopWait = time.Second

// announceOnEveryNode publishes the purge of k, already announced on the
// master, on every data node the sentinels name as the master or one of its
// replicas, the failed master included. A proxy's purge subscription stays
// on the node it was opened on: after a failover, on the old master, until
// Sentinel reconfigures it (seconds) or the connection drops (go-redis moves
// its command connections to the new master, not its Pub/Sub ones). A
// PUBLISH on that node reaches it at once. A replica also hears the master's
// PUBLISH through replication: a proxy may hear a purge twice, which is
// harmless. Best effort: a node that cannot be reached is noted on stderr
// (a proxy still subscribed there stops hearing its own probes, published
// on the master, and turns its replay cache off within 20 s).
func (kc *keysCmd) announceOnEveryNode(ctx context.Context, k claim.Key) {
	cfg := kc.cfg
	client := func(addr, user, password string) *redis.Client {
		return redis.NewClient(&redis.Options{
			Addr: addr, Username: user, Password: password, TLSConfig: redisTLS(cfg),
			MaxRetries: -1, DialerRetries: dialerRetries,
			ContextTimeoutEnabled: true, DialTimeout: kc.timeout, ReadTimeout: kc.timeout, WriteTimeout: kc.timeout,
		})
	}
	var (
		mu    sync.Mutex
		nodes = map[string]bool{}
		wg    sync.WaitGroup
	)
	asked := 0
	for _, addr := range cfg.RedisAddrs {
		wg.Go(func() {
			sc := sentinelClient(cfg, addr, kc.timeout)
			defer sc.Close()
			master, merr := sc.GetMasterAddrByName(ctx, cfg.RedisMasterName).Result()
			replicas, rerr := sc.Replicas(ctx, cfg.RedisMasterName).Result()
			mu.Lock()
			defer mu.Unlock()
			if merr == nil && len(master) == 2 {
				nodes[net.JoinHostPort(master[0], master[1])] = true
			}
			for _, r := range replicas {
				if r["ip"] != "" && r["port"] != "" {
					nodes[net.JoinHostPort(r["ip"], r["port"])] = true
				}
			}
			if merr == nil || rerr == nil {
				asked++
			}
		})
	}
	wg.Wait()
	if asked == 0 {
		fmt.Fprintf(kc.stderr, "idemproxy keys %s: no sentinel of REDIS_ADDRS=%q answered; the purge was announced on the master only\n", kc.name, strings.Join(cfg.RedisAddrs, ","))
		return
	}
	for addr := range nodes {
		wg.Go(func() {
			c := client(addr, cfg.RedisUsername, cfg.RedisPassword)
			defer c.Close()
			if err := c.Publish(ctx, claim.PurgeChannel(cfg.KeyPrefix), k.String()).Err(); err != nil {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(kc.stderr, "idemproxy keys %s: could not announce it on %s too (%v); a proxy still subscribed there notices within 20 s (its probe goes unheard) and drops its replay cache\n", kc.name, addr, err)
			}
		})
	}
	wg.Wait()
}
