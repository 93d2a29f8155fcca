package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v10"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/proxy/signature"
)

// Config is the whole configuration: one field per environment variable of
// the contract (README "Configuration").
type Config struct {
	UpstreamURL            string        `env:"UPSTREAM_URL,required,notEmpty"`
	ListenAddr             string        `env:"LISTEN_ADDR" envDefault:":8080"`
	AdminAddr              string        `env:"ADMIN_ADDR" envDefault:":9090"`
	RedisURL               string        `env:"REDIS_URL"`
	RedisMode              string        `env:"REDIS_MODE" envDefault:"standalone"`
	RedisAddrs             []string      `env:"REDIS_ADDRS" envSeparator:","`
	RedisMasterName        string        `env:"REDIS_MASTER_NAME" envDefault:"mymaster"`
	RedisUsername          string        `env:"REDIS_USERNAME"`
	RedisPassword          string        `env:"REDIS_PASSWORD"`
	RedisSentinelUsername  string        `env:"REDIS_SENTINEL_USERNAME"`
	RedisSentinelPassword  string        `env:"REDIS_SENTINEL_PASSWORD"`
	RedisTLS               bool          `env:"REDIS_TLS" envDefault:"false"`
	RedisWaitReplicas      int           `env:"REDIS_WAIT_REPLICAS" envDefault:"0"`
	RedisWaitTimeout       time.Duration `env:"REDIS_WAIT_TIMEOUT" envDefault:"1s"`
	RedisAutoPipeline      bool          `env:"REDIS_AUTOPIPELINE" envDefault:"true"`
	ReplayCacheBytes       int           `env:"REPLAY_CACHE_BYTES" envDefault:"16777216"`
	KeyPrefix              string        `env:"KEY_PREFIX" envDefault:"idem:"`
	RecordFormat           string        `env:"RECORD_FORMAT" envDefault:"hash"`
	IdempotencyHeader      string        `env:"IDEMPOTENCY_HEADER" envDefault:"Idempotency-Key"`
	Methods                []string      `env:"METHODS" envDefault:"POST" envSeparator:","`
	TTL                    time.Duration `env:"TTL" envDefault:"24h"`
	LockTTL                time.Duration `env:"LOCK_TTL" envDefault:"60s"`
	UpstreamTimeout        time.Duration `env:"UPSTREAM_TIMEOUT" envDefault:"30s"`
	UpstreamID             string        `env:"UPSTREAM_ID"`
	RequestReadTimeout     time.Duration `env:"REQUEST_READ_TIMEOUT" envDefault:"10s"`
	RequireKey             bool          `env:"REQUIRE_KEY" envDefault:"false"`
	MaxKeyLength           int           `env:"MAX_KEY_LENGTH" envDefault:"255"`
	MaxBodyBytes           int64         `env:"MAX_BODY_BYTES" envDefault:"1048576"`
	MaxStoredResponseBytes int64         `env:"MAX_STORED_RESPONSE_BYTES" envDefault:"1048576"`
	MaxBufferedBytes       int64         `env:"MAX_BUFFERED_BYTES" envDefault:"33554432"`
	GoMemLimitRatio        float64       `env:"GOMEMLIMIT_RATIO" envDefault:"0.9"`
	ScopeHeaders           []string      `env:"SCOPE_HEADERS" envDefault:"Authorization" envSeparator:","`
	FailMode               string        `env:"FAIL_MODE" envDefault:"closed"`
	WaitTimeout            time.Duration `env:"WAIT_TIMEOUT" envDefault:"0s"`
	On5xx                  string        `env:"ON_5XX" envDefault:"release"`
	Fingerprint            string        `env:"FINGERPRINT" envDefault:"strict"`
	OnUnknown              string        `env:"ON_UNKNOWN" envDefault:"expire"`
	Mode                   string        `env:"MODE" envDefault:"enforce"`
	DocsURL                string        `env:"DOCS_URL"`
	SignatureTolerance     time.Duration `env:"SIGNATURE_TOLERANCE" envDefault:"5m"`
	Routes                 string        `env:"ROUTES"`
	LogLevel               string        `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat              string        `env:"LOG_FORMAT" envDefault:"json"`
	ShutdownTimeout        time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"60s"`

	// Derived by loadConfig.
	warnings []string // allowed but risky settings, for the log and /readyz
	// goMemLimit is GOMEMLIMIT, Go's own variable: when set, the runtime has
	// applied it, and GOMEMLIMIT_RATIO is not (memlimit.go).
	goMemLimit string
	upstream   *url.URL
	// upstreamID is UPSTREAM_ID, or when it is unset or empty the identity
	// derived from UPSTREAM_URL (see deriveUpstreamID). It is part of the
	// request fingerprint: answers recorded in front of one upstream are
	// never replayed by a proxy in front of another.
	upstreamID string
	routes     []proxy.Route
	level      zerolog.Level
	fp         proxy.Fingerprint
	tracing    tracingConfig // OTEL_* (tracing.go)
	// withoutSecrets: verify= secrets are not read (idemproxy keys).
	withoutSecrets bool
}

// loadConfig parses and validates the environment (KEY=value entries, as
// os.Environ returns). The error lists every problem found, each naming the
// variable and the value.
func loadConfig(environ []string) (*Config, error) {
	return parseConfig(environ, false)
}

// loadKeysConfig is loadConfig for idemproxy keys, which reads ROUTES but
// verifies no signature: the senders' secrets that verify= names are not
// needed there (an operator must not have to copy them to a bastion).
func loadKeysConfig(environ []string) (*Config, error) {
	return parseConfig(environ, true)
}

func parseConfig(environ []string, withoutSecrets bool) (*Config, error) {
	envMap := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			envMap[k] = v
		}
	}
	cfg := Config{withoutSecrets: withoutSecrets}
	var problems []string
	failed := map[string]bool{}
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: envMap}); err != nil {
		problems = append(problems, envProblems(err, envMap, failed)...)
	}
	// caarlos0/env replaces an empty value by the default. For these, set
	// but empty means "none": no admin listener, no prefix, no scope headers.
	if v, ok := envMap["ADMIN_ADDR"]; ok && strings.TrimSpace(v) == "" {
		cfg.AdminAddr = ""
	}
	if v, ok := envMap["KEY_PREFIX"]; ok && v == "" {
		cfg.KeyPrefix = ""
	}
	if v, ok := envMap["SCOPE_HEADERS"]; ok && strings.TrimSpace(v) == "" {
		cfg.ScopeHeaders = nil
	}
	if strings.TrimSpace(envMap["MAX_BUFFERED_BYTES"]) == "" {
		// Unset, the default grows to hold one request of the largest size
		// the other two allow: a configuration that started before
		// MAX_BUFFERED_BYTES existed still starts.
		cfg.MaxBufferedBytes = max(cfg.MaxBufferedBytes, cfg.oneRequestBytes())
	}
	cfg.goMemLimit = strings.TrimSpace(envMap["GOMEMLIMIT"])
	problems = append(problems, cfg.validate(envMap, failed)...)
	if len(problems) > 0 {
		return nil, errors.New("invalid configuration:\n  " + strings.Join(problems, "\n  "))
	}
	return &cfg, nil
}

// envProblems turns caarlos0/env's errors, which name Go fields, into
// messages that name the variable and quote its value. It marks the
// variables that failed to parse in failed, so validate does not report
// them again with the zero value they were left at.
func envProblems(err error, envMap map[string]string, failed map[string]bool) []string {
	var agg env.AggregateError
	errs := []error{err}
	if errors.As(err, &agg) {
		errs = agg.Errors
	}
	var out []string
	for _, e := range errs {
		var pe env.ParseError
		var unset env.EnvVarIsNotSetError
		var empty env.EmptyEnvVarError
		switch {
		case errors.As(e, &pe):
			name := envName(pe.Name)
			failed[name] = true
			out = append(out, fmt.Sprintf("%s=%q: %s", name, envMap[name], typeHint(pe.Type)))
		case errors.As(e, &unset):
			failed[unset.Key] = true
			out = append(out, fmt.Sprintf("%s is required but not set", unset.Key))
		case errors.As(e, &empty):
			failed[empty.Key] = true
			out = append(out, fmt.Sprintf("%s is required but empty", empty.Key))
		default:
			out = append(out, e.Error())
		}
	}
	return out
}

// envName maps a Config field name to its variable name.
func envName(field string) string {
	f, ok := reflect.TypeFor[Config]().FieldByName(field)
	if !ok {
		return field
	}
	name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
	return name
}

func typeHint(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return "not a duration; use Go syntax such as 90s, 2m or 48h"
	case reflect.TypeFor[bool]():
		return "not a boolean; use true or false"
	case reflect.TypeFor[int](), reflect.TypeFor[int64]():
		return "not a whole number"
	case reflect.TypeFor[float64](): // GOMEMLIMIT_RATIO, the one float
		return "not a number; want 0 (off) or a fraction from 0.5 to 1, such as 0.9"
	}
	return "cannot be parsed as " + t.String()
}

// validate checks values and their relations, one concern at a time; each
// problem names the variable and the value as the operator wrote it (raw).
// Variables in failed did not parse and are not checked again.
func (c *Config) validate(raw map[string]string, failed map[string]bool) []string {
	k := &checker{raw: raw, failed: failed}
	c.checkUpstream(k)
	c.checkRedis(k)
	c.checkRequests(k)
	c.checkTimeouts(k)
	c.checkSizes(k)
	c.checkModes(k)
	c.checkRoutes(k)
	c.checkTracing(k)
	c.collectWarnings()
	return k.problems
}

// checker collects configuration problems.
type checker struct {
	raw      map[string]string
	failed   map[string]bool
	problems []string
}

func (k *checker) bad(format string, args ...any) {
	k.problems = append(k.problems, fmt.Sprintf(format, args...))
}

// value is what the operator wrote, or when unset the default as the
// README writes it (60s, not 1m0s); parsed when there is neither.
func (k *checker) value(name, parsed string) string {
	if v := k.raw[name]; v != "" {
		return v
	}
	if d, ok := envDefaults[name]; ok {
		return d
	}
	return parsed
}

// envDefaults maps each variable to its envDefault tag.
var envDefaults = func() map[string]string {
	m := map[string]string{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if d, ok := f.Tag.Lookup("envDefault"); ok && name != "" {
			m[name] = d
		}
	}
	return m
}()

// checkUpstream checks UPSTREAM_URL and UPSTREAM_ID.
func (c *Config) checkUpstream(k *checker) {
	if c.UpstreamURL != "" {
		u, err := url.Parse(c.UpstreamURL)
		shown := redactURL(c.UpstreamURL)
		switch {
		case !strings.Contains(c.UpstreamURL, "://"):
			// "127.0.0.1:9000" or "api.internal:8080": Go's parser would
			// answer "first path segment in URL cannot contain colon".
			k.bad("UPSTREAM_URL=%q: no scheme; write it as http://%s (or https://)", shown, strings.TrimPrefix(shown, "//"))
		case err != nil:
			k.bad("UPSTREAM_URL=%q: malformed URL%s", shown, safeReason(c.UpstreamURL, err))
		case u.Scheme != "http" && u.Scheme != "https":
			k.bad("UPSTREAM_URL=%q: scheme must be http or https", shown)
		case u.Host == "":
			k.bad("UPSTREAM_URL=%q: no host", shown)
		default:
			c.upstream = u
		}
	}
	switch id := strings.TrimSpace(c.UpstreamID); {
	case c.UpstreamID != "" && id == "":
		k.bad("UPSTREAM_ID=%q: blank; leave it empty to derive it from UPSTREAM_URL, or give an identifier", c.UpstreamID)
	case len(id) > maxUpstreamIDBytes:
		k.bad("UPSTREAM_ID=%q...: %d bytes, at most %d", id[:32], len(id), maxUpstreamIDBytes)
	case strings.IndexFunc(id, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0:
		k.bad("UPSTREAM_ID=%q: only printable ASCII characters are allowed", id)
	case id != "":
		c.upstreamID = id
	case c.upstream != nil:
		c.upstreamID = deriveUpstreamID(c.upstream)
	}
}

// checkRedis checks the Redis mode, addresses, credentials and WAIT.
func (c *Config) checkRedis(k *checker) {
	switch c.RedisMode {
	case "standalone":
		if c.RedisURL != "" {
			if opt, err := redis.ParseURL(c.RedisURL); err == nil {
				checkRedisURLOptions(k, redactURL(c.RedisURL), opt)
				// WAIT holds the connection for up to REDIS_WAIT_TIMEOUT: a
				// read_timeout= that ends first makes every claim an I/O
				// error. Without read_timeout= the proxy raises it itself.
				if c.RedisWaitReplicas > 0 && opt.ReadTimeout > 0 && c.RedisWaitTimeout >= opt.ReadTimeout {
					k.bad("REDIS_WAIT_TIMEOUT=%q must be below the read_timeout=%v that REDIS_URL sets: WAIT holds the connection for up to REDIS_WAIT_TIMEOUT, "+
						"and a read timeout that ends first turns every claim into an I/O error instead of \"not acknowledged by enough replicas\". "+
						"Raise read_timeout above it, or remove it (the proxy then uses REDIS_WAIT_TIMEOUT + 1s)",
						k.value("REDIS_WAIT_TIMEOUT", c.RedisWaitTimeout.String()), opt.ReadTimeout)
				}
			} else {
				// The parser's message may quote parts of a password.
				k.bad("REDIS_URL=%q: malformed URL%s", redactURL(c.RedisURL), safeReason(c.RedisURL, err))
			}
		}
		if len(c.RedisAddrs) > 0 {
			k.bad("REDIS_ADDRS=%q: only used with REDIS_MODE=sentinel or cluster; in standalone mode set REDIS_URL", strings.Join(c.RedisAddrs, ","))
		}
		if c.RedisUsername != "" || c.RedisPassword != "" || c.RedisTLS {
			k.bad("REDIS_USERNAME, REDIS_PASSWORD and REDIS_TLS are for sentinel/cluster; in standalone mode put them in REDIS_URL (rediss://user:password@host:6379/0)")
		}
	case "sentinel", "cluster":
		if c.RedisURL != "" {
			k.bad("REDIS_URL=%q: only used with REDIS_MODE=standalone; with REDIS_MODE=%s set REDIS_ADDRS", redactURL(c.RedisURL), c.RedisMode)
		}
		// Seeds are trimmed ("a:26379, b:26379" is two seeds, not one and
		// " b:26379", which no resolver dials) and empty entries dropped.
		rawAddrs := k.value("REDIS_ADDRS", strings.Join(c.RedisAddrs, ","))
		addrs := make([]string, 0, len(c.RedisAddrs))
		for _, a := range c.RedisAddrs {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		switch {
		case len(addrs) == 0 && len(c.RedisAddrs) > 0:
			k.bad("REDIS_ADDRS=%q: no host:port in it, only separators and blanks; with REDIS_MODE=%s list the seeds (host:port,host:port)", rawAddrs, c.RedisMode)
		case len(addrs) == 0:
			k.bad("REDIS_ADDRS is required with REDIS_MODE=%s (comma-separated host:port seeds)", c.RedisMode)
		}
		for _, a := range addrs {
			if !validHostPort(a) {
				k.bad("REDIS_ADDRS=%q: %q is not host:port (a host name or IP address, [IPv6] in brackets, and a port from 1 to 65535; no redis:// scheme)", rawAddrs, a)
			}
		}
		c.RedisAddrs = addrs
		if c.RedisMode == "sentinel" && c.RedisMasterName == "" {
			k.bad("REDIS_MASTER_NAME is required with REDIS_MODE=sentinel")
		}
	default:
		k.bad("REDIS_MODE=%q: want standalone, sentinel or cluster", c.RedisMode)
	}
	// Sentinel credentials: never quoted, only named.
	if c.RedisMode != "sentinel" {
		if c.RedisSentinelUsername != "" {
			k.bad("REDIS_SENTINEL_USERNAME is set but REDIS_MODE=%q: it authenticates to the sentinels and is only used with REDIS_MODE=sentinel; unset it", c.RedisMode)
		}
		if c.RedisSentinelPassword != "" {
			k.bad("REDIS_SENTINEL_PASSWORD is set but REDIS_MODE=%q: it authenticates to the sentinels and is only used with REDIS_MODE=sentinel; unset it", c.RedisMode)
		}
	} else if c.RedisSentinelUsername != "" && c.RedisSentinelPassword == "" {
		k.bad("REDIS_SENTINEL_USERNAME is set without REDIS_SENTINEL_PASSWORD: the sentinels are authenticated with both (set the password, or unset the username to use the default user)")
	}

	if c.RedisWaitReplicas < 0 {
		k.bad("REDIS_WAIT_REPLICAS=%q: must not be negative", k.value("REDIS_WAIT_REPLICAS", fmt.Sprint(c.RedisWaitReplicas)))
	}
	if c.RedisWaitReplicas > 0 && c.RedisMode == "standalone" && c.RedisURL == "" {
		k.bad("REDIS_WAIT_REPLICAS=%q: the embedded Redis (REDIS_URL empty) has no replicas", k.value("REDIS_WAIT_REPLICAS", ""))
	}
	if c.RedisWaitTimeout <= 0 && !k.failed["REDIS_WAIT_TIMEOUT"] {
		k.bad("REDIS_WAIT_TIMEOUT=%q: must be above zero", k.value("REDIS_WAIT_TIMEOUT", c.RedisWaitTimeout.String()))
	}
}

// checkRequests checks what a request may carry: the key header, methods, scope headers, the key prefix.
func (c *Config) checkRequests(k *checker) {
	// Names are RFC 9110 tokens: a value copied with its quotes
	// (IDEMPOTENCY_HEADER="Idempotency-Key" from an env file) or a list
	// written with ';' names a header no request carries, and would leave
	// every request unkeyed or every caller in one scope.
	if !proxy.ValidHeaderName(c.IdempotencyHeader) {
		k.bad("IDEMPOTENCY_HEADER=%q: not a header name (an RFC 9110 token: no quotes, spaces or separators such as , ; : /)", c.IdempotencyHeader)
	}
	c.IdempotencyHeader = http.CanonicalHeaderKey(c.IdempotencyHeader)
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		k.bad("KEY_PREFIX=%q: must not contain { or }: the proxy adds the Redis Cluster hash tag itself, and one in the prefix would put every key in one slot", c.KeyPrefix)
	}
	methods := make([]string, 0, len(c.Methods))
	for _, m := range c.Methods {
		m = strings.ToUpper(strings.TrimSpace(m))
		if !proxy.ValidHeaderName(m) { // a method is a token too
			if !k.failed["METHODS"] {
				k.bad("METHODS=%q: %q is not an HTTP method", k.value("METHODS", ""), m)
				k.failed["METHODS"] = true // one message is enough
			}
			continue
		}
		if !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	c.Methods = methods
	for i, h := range c.ScopeHeaders {
		c.ScopeHeaders[i] = strings.TrimSpace(h)
		switch {
		case c.ScopeHeaders[i] == "":
			k.bad("SCOPE_HEADERS=%q: empty header name", strings.Join(c.ScopeHeaders, ","))
		case !proxy.ValidHeaderName(c.ScopeHeaders[i]):
			k.bad("SCOPE_HEADERS=%q: %q is not a header name (an RFC 9110 token: no quotes, spaces or separators such as ; : /; names are separated by commas)", k.value("SCOPE_HEADERS", ""), c.ScopeHeaders[i])
		}
	}
}

// checkTimeouts checks the durations and how they bound each other.
func (c *Config) checkTimeouts(k *checker) {
	positive := func(name string, d time.Duration) {
		if d <= 0 && !k.failed[name] {
			k.bad("%s=%q: must be above zero", name, k.value(name, d.String()))
		}
	}
	positive("TTL", c.TTL)
	positive("LOCK_TTL", c.LockTTL)
	positive("UPSTREAM_TIMEOUT", c.UpstreamTimeout)
	positive("REQUEST_READ_TIMEOUT", c.RequestReadTimeout)
	positive("SHUTDOWN_TIMEOUT", c.ShutdownTimeout)
	if c.WaitTimeout < 0 {
		k.bad("WAIT_TIMEOUT=%q: must not be negative", k.value("WAIT_TIMEOUT", c.WaitTimeout.String()))
	}
	if c.UpstreamTimeout > 0 && c.LockTTL > 0 && c.UpstreamTimeout >= c.LockTTL {
		k.bad("UPSTREAM_TIMEOUT=%q must be below LOCK_TTL=%q: otherwise a request still running could lose its claim and execute twice",
			k.value("UPSTREAM_TIMEOUT", c.UpstreamTimeout.String()), k.value("LOCK_TTL", c.LockTTL.String()))
	} else if c.UpstreamTimeout > 0 && c.LockTTL > 0 && c.claimSpan() >= c.LockTTL {
		k.bad("REDIS_WAIT_TIMEOUT=%q + UPSTREAM_TIMEOUT=%q must be below LOCK_TTL=%q with REDIS_WAIT_REPLICAS: the lock runs from the claim, and WAIT holds the claim's answer "+
			"for up to REDIS_WAIT_TIMEOUT before the request is forwarded; a lock that ends first lets a retry take the claim over while the first request still runs, and the key executes twice",
			k.value("REDIS_WAIT_TIMEOUT", c.RedisWaitTimeout.String()), k.value("UPSTREAM_TIMEOUT", c.UpstreamTimeout.String()), k.value("LOCK_TTL", c.LockTTL.String()))
	}
	if need := shutdownHeaderWindow + c.RequestReadTimeout + c.claimSpan() + recordBudget; c.UpstreamTimeout > 0 && c.RequestReadTimeout > 0 && c.ShutdownTimeout > 0 && c.ShutdownTimeout < need {
		wait := ""
		if c.RedisWaitReplicas > 0 {
			wait = fmt.Sprintf(" + REDIS_WAIT_TIMEOUT=%q (the claim's WAIT)", k.value("REDIS_WAIT_TIMEOUT", c.RedisWaitTimeout.String()))
		}
		k.bad("SHUTDOWN_TIMEOUT=%q must be at least REQUEST_READ_TIMEOUT=%q + UPSTREAM_TIMEOUT=%q%s + %v: on SIGTERM a connection accepted just before may still send its request for %v, "+
			"a keyed request may then still be receiving its body, wait UPSTREAM_TIMEOUT for its answer and up to %v to record it; "+
			"a shorter SHUTDOWN_TIMEOUT exits with its claim in flight, and the client's retry executes again after LOCK_TTL. Raise SHUTDOWN_TIMEOUT to %v or more (and the pod's termination grace period above it)",
			k.value("SHUTDOWN_TIMEOUT", c.ShutdownTimeout.String()), k.value("REQUEST_READ_TIMEOUT", c.RequestReadTimeout.String()),
			k.value("UPSTREAM_TIMEOUT", c.UpstreamTimeout.String()), wait, shutdownHeaderWindow+recordBudget, shutdownHeaderWindow, recordBudget, need)
	}
	if c.TTL > 0 && c.LockTTL > 0 && c.TTL < c.LockTTL {
		k.bad("TTL=%q must not be below LOCK_TTL=%q: a completed answer would be forgotten before an in-flight claim of the same key expires",
			k.value("TTL", c.TTL.String()), k.value("LOCK_TTL", c.LockTTL.String()))
	}
}

// checkSizes checks the key length and the byte limits.
func (c *Config) checkSizes(k *checker) {
	if c.MaxKeyLength <= 0 && !k.failed["MAX_KEY_LENGTH"] {
		k.bad("MAX_KEY_LENGTH=%q: must be above zero", k.value("MAX_KEY_LENGTH", fmt.Sprint(c.MaxKeyLength)))
	}
	if c.MaxBodyBytes <= 0 && !k.failed["MAX_BODY_BYTES"] {
		k.bad("MAX_BODY_BYTES=%q: must be above zero", k.value("MAX_BODY_BYTES", fmt.Sprint(c.MaxBodyBytes)))
	}
	if c.MaxBodyBytes > maxPerRequestBytes {
		k.bad("MAX_BODY_BYTES=%q: at most %d (64 MiB): every keyed request in flight may hold that much in memory",
			k.value("MAX_BODY_BYTES", fmt.Sprint(c.MaxBodyBytes)), maxPerRequestBytes)
	}
	if c.MaxStoredResponseBytes > maxPerRequestBytes {
		k.bad("MAX_STORED_RESPONSE_BYTES=%q: at most %d (64 MiB): every answer being recorded may hold that much in memory, and each record is one Redis value",
			k.value("MAX_STORED_RESPONSE_BYTES", fmt.Sprint(c.MaxStoredResponseBytes)), maxPerRequestBytes)
	}
	if c.ReplayCacheBytes < 0 {
		k.bad("REPLAY_CACHE_BYTES=%q: must not be negative (0 disables the cache)", k.value("REPLAY_CACHE_BYTES", fmt.Sprint(c.ReplayCacheBytes)))
	}
	if c.MaxStoredResponseBytes < 0 {
		k.bad("MAX_STORED_RESPONSE_BYTES=%q: must not be negative", k.value("MAX_STORED_RESPONSE_BYTES", fmt.Sprint(c.MaxStoredResponseBytes)))
	}
	// 0 is off; a ratio under one half leaves most of the container unused
	// and has the collector run all the time: a typo (0.09 for 0.9), not a
	// setting. (NaN fails both comparisons.)
	if r := c.GoMemLimitRatio; r != 0 && !(r >= 0.5 && r <= 1) && !k.failed["GOMEMLIMIT_RATIO"] {
		k.bad("GOMEMLIMIT_RATIO=%q: want 0 (off) or a fraction of the container's memory limit from 0.5 to 1", k.value("GOMEMLIMIT_RATIO", fmt.Sprint(r)))
	}
	one := c.oneRequestBytes()
	switch {
	case k.failed["MAX_BUFFERED_BYTES"]:
	case c.MaxBufferedBytes <= 0:
		k.bad("MAX_BUFFERED_BYTES=%q: must be above zero", k.value("MAX_BUFFERED_BYTES", fmt.Sprint(c.MaxBufferedBytes)))
	case c.MaxBufferedBytes < one && c.fingerprintScratch() > 0:
		k.bad("MAX_BUFFERED_BYTES=%q: must hold one keyed request's body, its canonical form's scratch (fingerprint=json) and its answer, at least MAX_BODY_BYTES=%q + %d + MAX_STORED_RESPONSE_BYTES=%q + %d = %d",
			k.value("MAX_BUFFERED_BYTES", fmt.Sprint(c.MaxBufferedBytes)), k.value("MAX_BODY_BYTES", fmt.Sprint(c.MaxBodyBytes)), c.fingerprintScratch(),
			k.value("MAX_STORED_RESPONSE_BYTES", fmt.Sprint(c.MaxStoredResponseBytes)), proxy.BodyChunk, one)
	case c.MaxBufferedBytes < one:
		k.bad("MAX_BUFFERED_BYTES=%q: must hold one keyed request's body and answer, at least MAX_BODY_BYTES=%q + MAX_STORED_RESPONSE_BYTES=%q + %d = %d",
			k.value("MAX_BUFFERED_BYTES", fmt.Sprint(c.MaxBufferedBytes)), k.value("MAX_BODY_BYTES", fmt.Sprint(c.MaxBodyBytes)),
			k.value("MAX_STORED_RESPONSE_BYTES", fmt.Sprint(c.MaxStoredResponseBytes)), proxy.BodyChunk, one)
	}
}

// oneRequestBytes is what MAX_BUFFERED_BYTES must hold at least: one keyed
// request's largest body and answer, and a chunk's slack, so that a request
// alone never takes the count past it.
func (c *Config) oneRequestBytes() int64 {
	return max(c.MaxBodyBytes, 0) + proxy.BodyChunk + max(c.MaxStoredResponseBytes, 0) + c.fingerprintScratch()
}

// fingerprintScratch is what fingerprint=json may count beside the largest
// body (its canonical form's scratch), when FINGERPRINT or a rule of ROUTES
// asks for it; 0 otherwise. Read from the raw values: it is needed before
// ROUTES is parsed.
func (c *Config) fingerprintScratch() int64 {
	json := c.Fingerprint == "json"
	for _, opt := range strings.Fields(strings.ReplaceAll(c.Routes, ";", " ")) {
		json = json || opt == "fingerprint=json"
	}
	if !json {
		return 0
	}
	return proxy.MaxFingerprintScratch(max(c.MaxBodyBytes, 0))
}

// checkModes checks FAIL_MODE, ON_5XX and the log settings.
func (c *Config) checkModes(k *checker) {
	if fp, err := proxy.ParseFingerprint(c.Fingerprint); err != nil {
		k.bad("FINGERPRINT=%v", err)
	} else {
		c.fp = fp
	}
	if c.FailMode != "closed" && c.FailMode != "open" {
		k.bad("FAIL_MODE=%q: want closed or open", c.FailMode)
	}
	if c.On5xx != "release" && c.On5xx != "store" {
		k.bad("ON_5XX=%q: want release or store", c.On5xx)
	}
	if c.RecordFormat != "hash" && c.RecordFormat != "string" {
		k.bad("RECORD_FORMAT=%q: want hash or string", c.RecordFormat)
	}
	if c.OnUnknown != "expire" && c.OnUnknown != "hold" {
		k.bad("ON_UNKNOWN=%q: want expire or hold", c.OnUnknown)
	}
	if c.Mode != "enforce" && c.Mode != "observe" {
		k.bad("MODE=%q: want enforce or observe", c.Mode)
	}
	if c.DocsURL != "" {
		if err := checkDocsURL(c.DocsURL); err != nil {
			k.bad("DOCS_URL=%q: %v", redactURL(c.DocsURL), err)
		}
	}
	if c.LogFormat != "json" && c.LogFormat != "console" {
		k.bad("LOG_FORMAT=%q: want json or console", c.LogFormat)
	}
	lvl, err := zerolog.ParseLevel(strings.ToLower(c.LogLevel))
	if err != nil || c.LogLevel == "" {
		k.bad("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal, panic or disabled", c.LogLevel)
	}
	c.level = lvl
}

// checkRoutes checks ROUTES and each rule against the global settings.
func (c *Config) checkRoutes(k *checker) {
	routes, err := proxy.ParseRoutes(c.Routes)
	if err != nil {
		k.bad("%v", err)
	}
	for _, rt := range routes {
		switch {
		case rt.LockTTL != nil && c.UpstreamTimeout >= *rt.LockTTL:
			k.bad("ROUTES rule %q: lock=%s must be above UPSTREAM_TIMEOUT=%q", rt.Rule, rt.LockTTL.String(), c.UpstreamTimeout.String())
		case rt.LockTTL != nil && c.claimSpan() >= *rt.LockTTL:
			k.bad("ROUTES rule %q: lock=%s must be above REDIS_WAIT_TIMEOUT=%q + UPSTREAM_TIMEOUT=%q with REDIS_WAIT_REPLICAS: WAIT holds the claim's answer before the request is forwarded, "+
				"and a lock that ends first lets a retry execute the key again", rt.Rule, rt.LockTTL.String(), c.RedisWaitTimeout.String(), c.UpstreamTimeout.String())
		}
		// The route's effective TTL must not be below its effective lock.
		ttl, ttlFrom := c.TTL, "TTL="+k.value("TTL", c.TTL.String())
		if rt.TTL != nil {
			ttl, ttlFrom = *rt.TTL, "ttl="+rt.TTL.String()
		}
		lock, lockFrom := c.LockTTL, "LOCK_TTL="+k.value("LOCK_TTL", c.LockTTL.String())
		if rt.LockTTL != nil {
			lock, lockFrom = *rt.LockTTL, "lock="+rt.LockTTL.String()
		}
		if (rt.TTL != nil || rt.LockTTL != nil) && ttl > 0 && lock > 0 && ttl < lock {
			k.bad("ROUTES rule %q: %s must not be below %s: a completed answer would be forgotten before an in-flight claim of the same key expires", rt.Rule, ttlFrom, lockFrom)
		}
	}
	c.checkVerify(k, routes)
	c.routes = routes
}

// checkVerify reads the secrets each verify= rule names and builds its
// Verifier, and checks SIGNATURE_TOLERANCE. No message quotes a secret.
func (c *Config) checkVerify(k *checker, routes []proxy.Route) {
	tolerance := "SIGNATURE_TOLERANCE=" + k.value("SIGNATURE_TOLERANCE", c.SignatureTolerance.String())
	if !k.failed["SIGNATURE_TOLERANCE"] && c.SignatureTolerance <= 0 {
		k.bad("%s must be above zero: how far a signed timestamp may be from now (Stripe, Standard Webhooks)", tolerance)
		return
	}
	for i := range routes {
		rt := &routes[i]
		if rt.Verify == nil || c.withoutSecrets {
			continue
		}
		var secrets []string
		for _, name := range rt.Verify {
			v, ok := k.raw[name]
			switch {
			case !ok:
				k.bad("ROUTES rule %q: verify= names %s, which is not set: it must hold the sender's signing secret", rt.Rule, name)
			case v == "":
				k.bad("ROUTES rule %q: verify= names %s, which is empty: it must hold the sender's signing secret", rt.Rule, name)
			case strings.TrimSpace(v) != v:
				// A newline from `echo secret | kubectl create secret`
				// makes every signature fail, silently for the sender.
				k.bad("ROUTES rule %q: %s starts or ends with white space (a newline from echo?); the secret is used byte for byte", rt.Rule, name)
			default:
				secrets = append(secrets, v)
			}
		}
		if len(secrets) != len(rt.Verify) {
			continue
		}
		v, err := signature.New(rt.Key.Text, secrets, c.SignatureTolerance)
		if err != nil {
			k.bad("ROUTES rule %q: verify=%s: %v", rt.Rule, strings.Join(rt.Verify, ","), err)
			continue
		}
		rt.Verifier = v
		// A delivery captured in transit can be sent again for as long as
		// its signed timestamp is within the tolerance: once its record is
		// gone, it would execute again.
		ttl, ttlFrom := c.TTL, "TTL="+k.value("TTL", c.TTL.String())
		if rt.TTL != nil {
			ttl, ttlFrom = *rt.TTL, "ttl="+rt.TTL.String()
		}
		if hasTimestamp := rt.Key.Text == "stripe-events" || rt.Key.Text == "standard-webhooks"; hasTimestamp && c.SignatureTolerance > ttl {
			k.bad("ROUTES rule %q: %s must not be above %s: a captured delivery could be sent again after its record expired, within its signature's tolerance, and execute again", rt.Rule, tolerance, ttlFrom)
		}
	}
}

// collectWarnings notes settings that are allowed but worth saying at
// start and in /readyz.
func (c *Config) collectWarnings() {
	// Allowed, but worth saying at start and in /readyz.
	recordWindow := func(lock time.Duration, where string) {
		if span := c.claimSpan(); lock > span && lock-span < minRecordWindow {
			after := "UPSTREAM_TIMEOUT=" + c.UpstreamTimeout.String()
			if c.RedisWaitReplicas > 0 {
				after = "REDIS_WAIT_TIMEOUT=" + c.RedisWaitTimeout.String() + " + " + after
			}
			c.warnings = append(c.warnings, fmt.Sprintf(
				"%s leaves %v after %s to record the answer; below %v a slow answer may not be recorded before its claim expires, and its retry executes again",
				where, lock-span, after, minRecordWindow))
		}
	}
	recordWindow(c.LockTTL, "LOCK_TTL="+c.LockTTL.String())
	for _, rt := range c.routes {
		if rt.LockTTL != nil {
			recordWindow(*rt.LockTTL, fmt.Sprintf("ROUTES rule %q", rt.Rule))
		}
	}
	if c.ScopeHeaders == nil {
		c.warnings = append(c.warnings, "SCOPE_HEADERS is empty: all callers share every key and can receive each other's recorded answers")
	}
	if c.FailMode == "open" {
		c.warnings = append(c.warnings, "FAIL_MODE=open: while Redis is unreachable, requests are forwarded without any guarantee")
	}
	def := c.policy()
	if def.Observe {
		c.warnings = append(c.warnings, "MODE=observe: every request is forwarded, duplicates included; answers are recorded but none is replayed or refused")
		if def.Wait > 0 {
			c.warnings = append(c.warnings, fmt.Sprintf("WAIT_TIMEOUT=%s is not used with MODE=observe: a duplicate of a request in flight is forwarded at once", c.WaitTimeout))
		}
	}
	// hold promises "never again without an operator"; failing open
	// forwards the retries of held keys while Redis is unreachable.
	if def.Hold && def.FailOpen {
		c.warnings = append(c.warnings, "ON_UNKNOWN=hold with FAIL_MODE=open: while Redis is unreachable, retries of keys whose outcome is unknown are forwarded and execute again")
	}
	for _, rt := range c.routes {
		hold, open := def.Hold, def.FailOpen
		if rt.Hold != nil {
			hold = *rt.Hold
		}
		if rt.FailOpen != nil {
			open = *rt.FailOpen
		}
		if hold && open && !rt.Off && (rt.Hold != nil || rt.FailOpen != nil) {
			c.warnings = append(c.warnings, fmt.Sprintf(
				"ROUTES rule %q: unknown=hold with fail=open (or FAIL_MODE=open): while Redis is unreachable, retries of keys whose outcome is unknown are forwarded and execute again", rt.Rule))
		}
	}
}

// maxUpstreamIDBytes bounds UPSTREAM_ID.
const maxUpstreamIDBytes = 512

// deriveUpstreamID is the default UPSTREAM_ID: UPSTREAM_URL as
// scheme://host[:port]/path, with the host lowercased, the scheme's default
// port dropped, a bare "/" path dropped, and credentials, query and
// fragment removed. So http://User:pw@API.example:80/v1/?x=1 and
// http://api.example/v1/ have the same identity.
func deriveUpstreamID(u *url.URL) string {
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	scheme := strings.ToLower(u.Scheme)
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	switch {
	case port != "":
		host = net.JoinHostPort(host, port)
	case strings.Contains(host, ":"): // IPv6 literal
		host = "[" + host + "]"
	}
	path := u.EscapedPath()
	if path == "/" {
		path = ""
	}
	return scheme + "://" + host + path
}

// maxPerRequestBytes bounds MAX_BODY_BYTES and MAX_STORED_RESPONSE_BYTES:
// each keyed request in flight may buffer its body, and each answer being
// recorded its body, in memory; records are single Redis values.
const maxPerRequestBytes = 64 << 20

// checkRedisURLOptions refuses go-redis options in REDIS_URL that would
// take away a bound the proxy relies on, or that go-redis itself cannot
// take (pool_size=-1 panics in it). shown is the URL without its password.
func checkRedisURLOptions(k *checker, shown string, opt *redis.Options) {
	// go-redis reads 0 and negative durations as "no timeout" (-1). The
	// claim waits on these: go-redis does not apply context deadlines to
	// its sockets, so without them a stalled Redis holds every keyed
	// request, and the start-up check, for as long as it stalls.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"dial_timeout", opt.DialTimeout}, {"read_timeout", opt.ReadTimeout}, {"write_timeout", opt.WriteTimeout}, {"pool_timeout", opt.PoolTimeout}} {
		if d.v < 0 {
			k.bad("REDIS_URL=%q: %s=%s turns the Redis client's timeout off; a stalled Redis would then hold keyed requests without end instead of answering 503. Give a positive duration, or leave it out for go-redis's default",
				shown, d.name, urlQuery(shown, d.name))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"pool_size", opt.PoolSize}, {"min_idle_conns", opt.MinIdleConns}, {"max_idle_conns", opt.MaxIdleConns}, {"max_active_conns", opt.MaxActiveConns}} {
		if n.v < 0 {
			k.bad("REDIS_URL=%q: %s=%d must not be negative (0 or leaving it out gives go-redis's default)", shown, n.name, n.v)
		}
	}
}

// urlQuery is the value of query parameter name in raw as written, for a
// message.
func urlQuery(raw, name string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Query().Get(name)
	}
	return "?"
}

// validHostPort reports whether a is host:port as a dialer takes it: a
// non-empty host without a scheme, path or spaces, and a numeric port.
func validHostPort(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || strings.ContainsAny(host, " \t/@?#") {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p >= 1 && p <= 65535
}

// claimSpan is the longest a claim's lock must hold from the claim until
// the upstream's answer: the claim's WAIT (REDIS_WAIT_REPLICAS), which
// returns the claim's answer only when the replicas acknowledged or
// REDIS_WAIT_TIMEOUT ran out, then the upstream call.
func (c *Config) claimSpan() time.Duration {
	if c.RedisWaitReplicas > 0 && c.RedisWaitTimeout > 0 {
		return c.RedisWaitTimeout + c.UpstreamTimeout
	}
	return c.UpstreamTimeout
}

// shutdownHeaderWindow: http.Server.Shutdown keeps a new connection that
// has not sent its request yet until it is 5s old (counted in whole
// seconds); a request that arrives in that window is served, and may claim.
const shutdownHeaderWindow = 6 * time.Second

// recordBudget is how long the proxy may spend recording one answer after
// the upstream answered, retries included.
const recordBudget = claim.CompleteBudget

// minRecordWindow is the time a claim should have left after the longest
// upstream call, for the completion and its retries.
const minRecordWindow = 5 * time.Second

// safeReason is err's reason, after ": ", unless it quotes a credential
// of raw (then a note that it is not shown): a password in the user info, a query value whose name
// says it is one (password=, token=, key=...), or the rest of a connection
// string pasted in place of a URL (host:6380,password=...,ssl=True).
func safeReason(raw string, err error) string {
	reason := urlErrorReason(err).Error()
	for _, f := range secretFragments(raw) {
		if len(f) >= 3 && strings.Contains(reason, f) {
			return " (the parser's reason is not shown: it quotes what may be a credential)"
		}
	}
	return ": " + reason
}

// credentialAssignment finds name=value pairs whose name says the value is
// a credential, in a query or a connection string.
var credentialAssignment = regexp.MustCompile(`(?i)(?:pass(?:word)?|pwd|secret|token|key|auth\w*|user(?:name)?|cred\w*)\s*=\s*([^,;&\s]+)`)

// secretFragments are the parts of raw that may be credentials.
func secretFragments(raw string) []string {
	var out []string
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		pw, _ := u.User.Password()
		out = append(out, pw, u.User.Username())
	}
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			// User info, whether or not Go parses it as such (a password
			// holding "/" or "?" ends the authority early), and its pieces.
			info := rest[:i]
			out = append(out, info)
			out = append(out, strings.FieldsFunc(info, func(r rune) bool { return strings.ContainsRune(":/?#", r) })...)
		}
	}
	for _, m := range credentialAssignment.FindAllStringSubmatch(raw, -1) {
		out = append(out, m[1])
	}
	if _, rest, ok := strings.Cut(raw, ","); ok {
		out = append(out, rest) // a connection string's options
	}
	return out
}

// urlErrorReason drops the URL that *url.Error repeats (it would show a
// password) and keeps the reason.
func urlErrorReason(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// redactURL hides credentials in a URL before it reaches a message: a
// password in the user info, and the whole query, where legacy APIs and
// some Redis clients take credentials (?api_key=, ?password=). A URL
// holding "@" that does not parse cleanly into user info and host (a
// password with "/", "?" or "#" makes Go read part of it as the path) is
// not shown at all, only its scheme.
func redactURL(s string) string {
	if !strings.Contains(s, "://") {
		if strings.ContainsAny(s, "@?#,;=") {
			// Not a URL: a connection string pasted in its place
			// (host:6380,password=...,ssl=True) or worse.
			return "(not shown: not a scheme:// URL, and it may hold a credential)"
		}
		return s // host:port, or a word
	}
	if !strings.ContainsAny(s, "@?#,;") {
		return s
	}
	u, err := url.Parse(s)
	if err == nil && !strings.Contains(u.Host+u.Path+u.RawQuery+u.Fragment, "@") {
		return shownURL(u)
	}
	scheme, _, _ := strings.Cut(s, "://")
	if len(scheme) > 10 || strings.ContainsAny(scheme, "@:/") {
		scheme = "?"
	}
	return scheme + "://(credentials and address not shown)"
}

// shownURL is u as logs and messages show it: scheme, user name (password
// masked), host, port and path; a query or fragment is replaced by a note
// that it is not shown, since it may carry a credential.
func shownURL(u *url.URL) string {
	v := *u
	v.RawQuery, v.ForceQuery, v.Fragment, v.RawFragment = "", false, "", ""
	shown := v.Redacted()
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		shown += "?(query not shown)"
	}
	return shown
}

// policy is the global idempotency policy, before ROUTES overrides.
func (c *Config) policy() proxy.Policy {
	return proxy.Policy{
		Required: c.RequireKey,
		TTL:      c.TTL,
		LockTTL:  c.LockTTL,
		Wait:     c.WaitTimeout,
		FailOpen: c.FailMode == "open",
		Store5xx: c.On5xx == "store",
		Hold:     c.OnUnknown == "hold",
		Observe:  c.Mode == "observe",
		// The global profile; a route's fingerprint= overrides it.
		Fingerprint: c.fp,
	}
}

// checkDocsURL accepts an absolute http(s) URL that can stand between the
// angle brackets of a Link header as it is: no spaces, quotes, angle
// brackets or control characters, and no credentials.
func checkDocsURL(s string) error {
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r > 0x7e || strings.ContainsRune(`<>"\`, r) {
			return fmt.Errorf("must not contain %q (percent-encode it)", r)
		}
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %w", urlErrorReason(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an absolute http:// or https:// URL")
	case u.Host == "":
		return errors.New("has no host")
	case u.User != nil:
		return errors.New("must not carry credentials: it is sent to every client")
	}
	return nil
}
