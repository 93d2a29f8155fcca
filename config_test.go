package main

// Tests of config.go: each variable parsed and checked, the checks of
// variables against each other, and what a refusal shows (the variable and
// its value, never a credential).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"net/http"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

func TestLoadConfigDefaults(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000"})
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"LISTEN_ADDR", cfg.ListenAddr, ":8080"},
		{"ADMIN_ADDR", cfg.AdminAddr, ":9090"},
		{"REDIS_URL", cfg.RedisURL, ""},
		{"REDIS_MODE", cfg.RedisMode, "standalone"},
		{"REDIS_ADDRS", len(cfg.RedisAddrs), 0},
		{"REDIS_MASTER_NAME", cfg.RedisMasterName, "mymaster"},
		{"REDIS_USERNAME", cfg.RedisUsername, ""},
		{"REDIS_PASSWORD", cfg.RedisPassword, ""},
		{"REDIS_TLS", cfg.RedisTLS, false},
		{"REDIS_WAIT_REPLICAS", cfg.RedisWaitReplicas, 0},
		{"REDIS_WAIT_TIMEOUT", cfg.RedisWaitTimeout, time.Second},
		{"REDIS_AUTOPIPELINE", cfg.RedisAutoPipeline, true},
		{"REPLAY_CACHE_BYTES", cfg.ReplayCacheBytes, 16 << 20},
		{"KEY_PREFIX", cfg.KeyPrefix, "idem:"},
		{"IDEMPOTENCY_HEADER", cfg.IdempotencyHeader, "Idempotency-Key"},
		{"METHODS", cfg.Methods, []string{"POST"}},
		{"TTL", cfg.TTL, 24 * time.Hour},
		{"LOCK_TTL", cfg.LockTTL, 60 * time.Second},
		{"UPSTREAM_TIMEOUT", cfg.UpstreamTimeout, 30 * time.Second},
		{"REQUIRE_KEY", cfg.RequireKey, false},
		{"MAX_KEY_LENGTH", cfg.MaxKeyLength, 255},
		{"MAX_BODY_BYTES", cfg.MaxBodyBytes, int64(1048576)},
		{"MAX_STORED_RESPONSE_BYTES", cfg.MaxStoredResponseBytes, int64(1048576)},
		{"SCOPE_HEADERS", cfg.ScopeHeaders, []string{"Authorization"}},
		{"FAIL_MODE", cfg.FailMode, "closed"},
		{"WAIT_TIMEOUT", cfg.WaitTimeout, time.Duration(0)},
		{"ON_5XX", cfg.On5xx, "release"},
		{"ON_UNKNOWN", cfg.OnUnknown, "expire"},
		{"RECORD_FORMAT", cfg.RecordFormat, "hash"},
		{"ON_UNKNOWN policy", cfg.policy().Hold, false},
		{"MODE", cfg.Mode, "enforce"},
		{"MODE policy", cfg.policy().Observe, false},
		{"DOCS_URL", cfg.DocsURL, ""},
		{"ROUTES", cfg.Routes, ""},
		{"ROUTES parsed", len(cfg.routes), 0},
		{"LOG_LEVEL", cfg.LogLevel, "info"},
		{"LOG_LEVEL parsed", cfg.level, zerolog.InfoLevel},
		{"LOG_FORMAT", cfg.LogFormat, "json"},
		{"SHUTDOWN_TIMEOUT", cfg.ShutdownTimeout, 60 * time.Second},
		{"UPSTREAM_URL parsed", cfg.upstream.String(), "http://127.0.0.1:9000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	tests := []struct {
		name    string
		env     []string
		want    []string // substrings of the error
		notWant []string // substrings that must not appear
	}{
		{
			name: "malformed duration", env: []string{up, "LOCK_TTL=abc"},
			want: []string{`LOCK_TTL="abc"`},
			// A value the operator never wrote must not be quoted back.
			notWant: []string{`LOCK_TTL="0s"`},
		},
		{name: "negative duration", env: []string{up, "TTL=-1h"}, want: []string{`TTL="-1h`}},
		{name: "zero duration", env: []string{up, "SHUTDOWN_TIMEOUT=0s"}, want: []string{`SHUTDOWN_TIMEOUT="0s"`}},
		{name: "negative wait", env: []string{up, "WAIT_TIMEOUT=-1s"}, want: []string{`WAIT_TIMEOUT="-1s"`}},
		{
			name: "malformed int", env: []string{up, "MAX_KEY_LENGTH=x"},
			want:    []string{`MAX_KEY_LENGTH="x"`},
			notWant: []string{`MAX_KEY_LENGTH="0"`},
		},
		{name: "malformed int64", env: []string{up, "MAX_BODY_BYTES=1e3"}, want: []string{`MAX_BODY_BYTES="1e3"`}},
		{name: "malformed bool", env: []string{up, "REQUIRE_KEY=maybe"}, want: []string{`REQUIRE_KEY="maybe"`}},
		{name: "FAIL_MODE enum", env: []string{up, "FAIL_MODE=sideways"}, want: []string{`FAIL_MODE="sideways"`}},
		{name: "ON_5XX enum", env: []string{up, "ON_5XX=retry"}, want: []string{`ON_5XX="retry"`}},
		{name: "ON_UNKNOWN enum", env: []string{up, "ON_UNKNOWN=retry"}, want: []string{`ON_UNKNOWN="retry": want expire or hold`}},
		{name: "RECORD_FORMAT enum", env: []string{up, "RECORD_FORMAT=json"}, want: []string{`RECORD_FORMAT="json": want hash or string`}},
		{name: "RECORD_FORMAT is case-sensitive", env: []string{up, "RECORD_FORMAT=String"}, want: []string{`RECORD_FORMAT="String": want hash or string`}},
		{name: "MODE enum", env: []string{up, "MODE=shadow"}, want: []string{`MODE="shadow": want enforce or observe`}},
		{name: "DOCS_URL relative", env: []string{up, "DOCS_URL=/docs"}, want: []string{`DOCS_URL="/docs": want an absolute http:// or https:// URL`}},
		{name: "DOCS_URL angle bracket", env: []string{up, "DOCS_URL=https://x.example/a>b"}, want: []string{`DOCS_URL="https://x.example/a>b": must not contain '>'`}},
		{name: "DOCS_URL space", env: []string{up, "DOCS_URL=https://x.example/a b"}, want: []string{`DOCS_URL="https://x.example/a b": must not contain ' '`}},
		{name: "DOCS_URL credentials", env: []string{up, "DOCS_URL=https://u:p@x.example/"}, want: []string{`DOCS_URL="https://u:xxxxx@x.example/": must not carry credentials`}},
		{name: "DOCS_URL ftp", env: []string{up, "DOCS_URL=ftp://x.example/"}, want: []string{`DOCS_URL="ftp://x.example/"`}},
		{name: "REDIS_MODE enum", env: []string{up, "REDIS_MODE=replica"}, want: []string{`REDIS_MODE="replica"`}},
		{name: "LOG_FORMAT enum", env: []string{up, "LOG_FORMAT=xml"}, want: []string{`LOG_FORMAT="xml"`}},
		{name: "LOG_LEVEL enum", env: []string{up, "LOG_LEVEL=loud"}, want: []string{`LOG_LEVEL="loud"`}},
		{name: "UPSTREAM_URL missing", env: []string{"LISTEN_ADDR=127.0.0.1:0"}, want: []string{"UPSTREAM_URL"}},
		{name: "UPSTREAM_URL empty", env: []string{"UPSTREAM_URL="}, want: []string{"UPSTREAM_URL"}},
		{name: "UPSTREAM_URL scheme", env: []string{"UPSTREAM_URL=ftp://127.0.0.1:21"}, want: []string{`UPSTREAM_URL="ftp://127.0.0.1:21"`, "scheme"}},
		{name: "UPSTREAM_URL without scheme", env: []string{"UPSTREAM_URL=127.0.0.1:9000"}, want: []string{`UPSTREAM_URL="127.0.0.1:9000": no scheme; write it as http://127.0.0.1:9000`}},
		{name: "UPSTREAM_URL no host", env: []string{"UPSTREAM_URL=http://"}, want: []string{`UPSTREAM_URL="http://"`}},
		{
			name: "UPSTREAM_TIMEOUT not below LOCK_TTL", env: []string{up, "UPSTREAM_TIMEOUT=45s", "LOCK_TTL=30s"},
			want: []string{`UPSTREAM_TIMEOUT="45s"`, `LOCK_TTL="30s"`},
		},
		{
			name: "UPSTREAM_TIMEOUT equal to LOCK_TTL", env: []string{up, "UPSTREAM_TIMEOUT=30s", "LOCK_TTL=30s"},
			want: []string{`UPSTREAM_TIMEOUT="30s"`, `LOCK_TTL="30s"`},
		},
		{
			name: "route lock below UPSTREAM_TIMEOUT", env: []string{up, "ROUTES=POST /v1/payments/* lock=10s"},
			want: []string{`ROUTES rule "POST /v1/payments/* lock=10s"`, "UPSTREAM_TIMEOUT"},
		},
		{
			name: "SHUTDOWN_TIMEOUT cannot cover UPSTREAM_TIMEOUT and recording", env: []string{up, "SHUTDOWN_TIMEOUT=30s", "UPSTREAM_TIMEOUT=30s"},
			want: []string{`SHUTDOWN_TIMEOUT="30s"`, `REQUEST_READ_TIMEOUT="10s"`, `UPSTREAM_TIMEOUT="30s"`, "record", "56s"},
		},
		{
			name: "SHUTDOWN_TIMEOUT below the default REQUEST_READ_TIMEOUT, UPSTREAM_TIMEOUT and recording", env: []string{up, "SHUTDOWN_TIMEOUT=55s"},
			want: []string{`SHUTDOWN_TIMEOUT="55s"`, `UPSTREAM_TIMEOUT="30s"`},
		},
		{name: "route unknown option", env: []string{up, "ROUTES=POST /v1/orders bogus"}, want: []string{`ROUTES rule "POST /v1/orders bogus"`}},
		{name: "route lower-case method", env: []string{up, "ROUTES=post /v1/orders"}, want: []string{`ROUTES rule "post /v1/orders"`}},
		{name: "route without pattern", env: []string{up, "ROUTES=POST"}, want: []string{`ROUTES rule "POST"`}},
		{name: "route pattern without slash", env: []string{up, "ROUTES=POST v1/orders"}, want: []string{`ROUTES rule "POST v1/orders"`}},
		{name: "route bad duration", env: []string{up, "ROUTES=POST /v1/orders ttl=soon"}, want: []string{`ROUTES rule "POST /v1/orders ttl=soon"`}},
		{name: "route bad fail", env: []string{up, "ROUTES=POST /v1/orders fail=maybe"}, want: []string{`ROUTES rule "POST /v1/orders fail=maybe"`}},
		{
			name: "route bad rule among good ones",
			env:  []string{up, "ROUTES=POST /v1/orders ttl=1h; POST /v1/webhooks/* off ttl=1h"},
			want: []string{`ROUTES rule "POST /v1/webhooks/* off ttl=1h"`},
		},
		{name: "sentinel without REDIS_ADDRS", env: []string{up, "REDIS_MODE=sentinel"}, want: []string{"REDIS_ADDRS", "sentinel"}},
		{name: "cluster without REDIS_ADDRS", env: []string{up, "REDIS_MODE=cluster"}, want: []string{"REDIS_ADDRS", "cluster"}},
		{name: "REDIS_ADDRS in standalone", env: []string{up, "REDIS_ADDRS=127.0.0.1:7000"}, want: []string{`REDIS_ADDRS="127.0.0.1:7000"`, "standalone"}},
		{
			name: "several problems at once",
			env:  []string{"LOCK_TTL=abc", "REQUIRE_KEY=maybe", "FAIL_MODE=sideways", "ROUTES=POST /v1/orders bogus", "REDIS_MODE=cluster"},
			want: []string{"UPSTREAM_URL", `LOCK_TTL="abc"`, `REQUIRE_KEY="maybe"`, `FAIL_MODE="sideways"`,
				`ROUTES rule "POST /v1/orders bogus"`, "REDIS_ADDRS"},
		},
	}
	fields := goFieldNames(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(tt.env)
			if err == nil {
				t.Fatalf("loadConfig(%q) = %+v, nil; want an error", tt.env, cfg)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not contain %s:\ngot %v", w, msg)
				}
			}
			for _, nw := range tt.notWant {
				if strings.Contains(msg, nw) {
					t.Errorf("error contains %s, a value not in the environment %q:\ngot %v", nw, tt.env, msg)
				}
			}
			for name, re := range fields {
				if re.MatchString(msg) {
					t.Errorf("error names the Go field %s instead of its variable:\ngot %v", name, msg)
				}
			}
		})
	}
}

// goFieldNames returns a pattern per exported Config field whose name differs
// from its variable: an operator must never see "LockTTL" in a message.
func goFieldNames(t *testing.T) map[string]*regexp.Regexp {
	t.Helper()
	out := map[string]*regexp.Regexp{}
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == f.Name {
			continue // TTL: the field and the variable share the name
		}
		out[f.Name] = regexp.MustCompile(`\b` + regexp.QuoteMeta(f.Name) + `\b`)
	}
	return out
}

func TestLoadConfigNeverShowsRedisPassword(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	const secret = "s3cretPW"
	tests := []struct {
		name string
		env  []string
	}{
		{"bad database", []string{up, "REDIS_URL=redis://user:" + secret + "@127.0.0.1:6379/abc"}},
		{"unknown option", []string{up, "REDIS_URL=redis://:" + secret + "@127.0.0.1:6379/0?bogus=1"}},
		{"bad scheme", []string{up, "REDIS_URL=http://user:" + secret + "@127.0.0.1:6379/0"}},
		{"unparseable port", []string{up, "REDIS_URL=redis://:" + secret + "@127.0.0.1:bad/0"}},
		{"bad escape", []string{up, "REDIS_URL=redis://user:" + secret + "%zz@127.0.0.1:6379/0"}},
		{"URL in sentinel mode", []string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:26379", "REDIS_URL=redis://user:" + secret + "@127.0.0.1:6379/0"}},
		{"unparseable URL in cluster mode", []string{up, "REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:7000", "REDIS_URL=redis://:" + secret + "@127.0.0.1:bad/0"}},
		{"slash in password", []string{up, "REDIS_URL=redis://default:8842/" + secret + "@redis:6379/0"}},
		{"slash in password, port-like", []string{up, "REDIS_URL=redis://default:s3cr/etPW" + secret + "@redis:6379/0"}},
		{"hash in password", []string{up, "REDIS_URL=redis://default:ab#" + secret + "@redis:6379/0"}},
		{"question mark in password", []string{up, "REDIS_URL=redis://default:ab?" + secret + "@redis:6379/0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env)
			if err == nil {
				t.Fatalf("loadConfig(%q) = nil error; want one naming REDIS_URL", tt.env)
			}
			if got := err.Error(); strings.Contains(got, secret) {
				t.Errorf("error shows the Redis password:\ngot %v", got)
			}
			if got := err.Error(); !strings.Contains(got, "REDIS_URL") {
				t.Errorf("error does not name REDIS_URL:\ngot %v", got)
			}
		})
	}
}

func TestLoadConfigNeverShowsUpstreamPassword(t *testing.T) {
	const secret = "s3cretPW"
	for _, v := range []string{
		"http://user:" + secret + "@[bad/x",
		"ftp://user:" + secret + "@legacy:80",
		"http://user:ab/" + secret + "@legacy:80",
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=" + v})
		if err == nil {
			t.Errorf("UPSTREAM_URL=%q accepted", v)
			continue
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "UPSTREAM_URL") {
			t.Errorf("UPSTREAM_URL=%q: error %q shows the password or does not name the variable", v, err)
		}
	}
}

// TestRedisURLQueryPasswordNeverShown: a credential in REDIS_URL's query
// (?password=..., a form other Redis clients accept and go-redis refuses)
// is never shown, at start or by idemproxy keys: messages show the URL
// without its query. go-redis's refusal used to be quoted with the whole
// URL, into stderr, pod events and CI logs.
func TestRedisURLQueryPasswordNeverShown(t *testing.T) {
	for _, url := range []string{
		"redis://127.0.0.1:6379/0?password=Zq7xRedisS3cret",
		"rediss://cache.internal:6380/0?user=app&password=Zq7xRedisS3cret",
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "REDIS_URL=" + url})
		if err != nil && strings.Contains(err.Error(), "Zq7xRedisS3cret") {
			t.Errorf("REDIS_URL's password is printed in clear: %v", err)
		}
		var stdout, stderr bytes.Buffer
		err = runKeys(context.Background(), []string{"list", "--timeout=2s"}, []string{"REDIS_URL=" + url}, &stdout, &stderr)
		if out := stdout.String() + stderr.String() + errString(err); strings.Contains(out, "Zq7xRedisS3cret") {
			t.Errorf("keys list: REDIS_URL's password is printed in clear: %s", firstLine(out))
		}
	}
}

func TestLoadConfigNormalisesAndWarns(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "IDEMPOTENCY_HEADER=idempotency-key",
		"UPSTREAM_TIMEOUT=30s", "LOCK_TTL=32s", "ROUTES=POST /x lock=31s", "FAIL_MODE=open", "SCOPE_HEADERS="})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IdempotencyHeader != "Idempotency-Key" {
		t.Errorf("IDEMPOTENCY_HEADER = %q, want the canonical Idempotency-Key", cfg.IdempotencyHeader)
	}
	want := []string{"LOCK_TTL=32s leaves 2s", `ROUTES rule "POST /x lock=31s" leaves 1s`, "SCOPE_HEADERS is empty", "FAIL_MODE=open"}
	all := strings.Join(cfg.warnings, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("warnings %q lack %q", cfg.warnings, w)
		}
	}
	if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "KEY_PREFIX=idem:{x}:"}); err == nil || !strings.Contains(err.Error(), `KEY_PREFIX="idem:{x}:"`) {
		t.Errorf("KEY_PREFIX with a hash tag: error %v, want one naming it", err)
	}
	obs, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "MODE=observe", "WAIT_TIMEOUT=2s"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"MODE=observe: every request is forwarded", "WAIT_TIMEOUT=2s is not used with MODE=observe"} {
		if !strings.Contains(strings.Join(obs.warnings, "\n"), w) {
			t.Errorf("observe: warnings %q lack %q", obs.warnings, w)
		}
	}
	def, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000"})
	if err != nil || len(def.warnings) != 0 {
		t.Errorf("defaults: warnings %q, err %v; want none", def.warnings, err)
	}
}

// TestConfigErrorsQuoteDefaultsAsWritten: a default the operator never set
// is quoted as the README writes it (60s, not 1m0s), and a malformed
// REDIS_URL says why when the reason cannot leak its password.
func TestConfigErrorsQuoteDefaultsAsWritten(t *testing.T) {
	_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "UPSTREAM_TIMEOUT=90s"})
	if err == nil || !strings.Contains(err.Error(), `LOCK_TTL="60s"`) || strings.Contains(err.Error(), "1m0s\"") {
		t.Errorf("error %v: want the default quoted as LOCK_TTL=\"60s\"", err)
	}
	_, err = loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "REDIS_URL=redis://:s3cret@127.0.0.1:1/x"})
	if err == nil || !strings.Contains(err.Error(), "invalid database number") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v: want the reason (database number), never the password", err)
	}
}

// TestHeaderNamesNoRequestCanCarryStopTheStart: SCOPE_HEADERS was checked
// only for empty names, and IDEMPOTENCY_HEADER only for spaces, tabs, ':'
// and ','. A value copied with its quotes (`docker run --env-file` keeps
// them: SCOPE_HEADERS="Authorization"), or a list written with ';', names a
// header no request can carry, and the proxy started without a word: with
// such a SCOPE_HEADERS every caller falls into the one anonymous scope, so
// one tenant's recorded answer is replayed to another tenant that reuses its
// key; with such an IDEMPOTENCY_HEADER no request is ever keyed.
//
// Contract: "A malformed value stops the process at start" (Part 1) and,
// for Part 2, "a bad value stops the process with a message that names the
// variable ... and the value"; the README: "Header and scope names must be
// RFC 9110 tokens; a name no request can carry stops the process at
// start". Route scope= already refuses exactly these names.
func TestHeaderNamesNoRequestCanCarryStopTheStart(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"SCOPE_HEADERS", `"Authorization"`},
		{"SCOPE_HEADERS", `Authorization;X-Tenant-Id`},
		{"SCOPE_HEADERS", `X-Tenant/Id`},
		{"IDEMPOTENCY_HEADER", `"Idempotency-Key"`},
		{"IDEMPOTENCY_HEADER", `Idempotency-Key;`},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", tc.name + "=" + tc.value})
			if err == nil {
				t.Errorf("%s=%s: accepted; no request can carry a header of that name", tc.name, tc.value)
				return
			}
			if !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), strings.Trim(tc.value, `"`)) {
				t.Errorf("refusal does not name %s and its value: %v", tc.name, err)
			}
		})
	}
}

// TestMethodsMustBeTokens: a method copied with its quotes, or written with a
// separator, is no method a request carries: every request would pass
// unkeyed.
func TestMethodsMustBeTokens(t *testing.T) {
	for _, v := range []string{`"POST"`, `POST;PUT`, `PO ST`, `POST,`} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", "METHODS=" + v})
		if err == nil || !strings.Contains(err.Error(), "METHODS") {
			t.Errorf("METHODS=%s: %v; want a refusal naming METHODS", v, err)
		}
	}
	for _, v := range []string{"POST", "post, put", "PATCH,DELETE"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", "METHODS=" + v}); err != nil {
			t.Errorf("METHODS=%s: %v; want it accepted", v, err)
		}
	}
}

// TestUpstreamID: UPSTREAM_ID defaults to UPSTREAM_URL's identity
// (scheme://host[:port]/path, normalised), and a set value is validated.
func TestUpstreamID(t *testing.T) {
	derived := []struct{ url, want string }{
		{"http://127.0.0.1:9000", "http://127.0.0.1:9000"},
		{"http://API.Example.com:80/", "http://api.example.com"},
		{"https://user:pw@Api.example.com:443/v1/Orders?x=1#frag", "https://api.example.com/v1/Orders"},
		{"https://api.example.com:8443/v1/", "https://api.example.com:8443/v1/"},
		{"HTTP://[::1]:80/x", "http://[::1]/x"},
		{"http://[::1]:8080", "http://[::1]:8080"},
	}
	for _, tt := range derived {
		cfg, err := loadConfig([]string{"UPSTREAM_URL=" + tt.url})
		if err != nil {
			t.Errorf("UPSTREAM_URL=%q: %v", tt.url, err)
			continue
		}
		if cfg.upstreamID != tt.want {
			t.Errorf("UPSTREAM_URL=%q: derived UPSTREAM_ID %q, want %q", tt.url, cfg.upstreamID, tt.want)
		}
	}
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, tt := range []struct{ env, want string }{
		{"UPSTREAM_ID=payments-v1", "payments-v1"},
		{"UPSTREAM_ID=  http://old-api.internal:8080  ", "http://old-api.internal:8080"},
		{"UPSTREAM_ID=", "http://127.0.0.1:9000"}, // empty (as a chart renders it): derived
	} {
		cfg, err := loadConfig([]string{up, tt.env})
		if err != nil || cfg.upstreamID != tt.want {
			t.Errorf("%s: upstreamID %q, err %v; want %q", tt.env, cfg.upstreamID, err, tt.want)
		}
	}
	for _, tt := range []struct{ env, want string }{
		{"UPSTREAM_ID=   ", `UPSTREAM_ID="   "`},
		{"UPSTREAM_ID=" + strings.Repeat("a", 513), "at most 512"},
		{"UPSTREAM_ID=caf\u00e9", `UPSTREAM_ID="café"`},
		{"UPSTREAM_ID=a\tb", "printable ASCII"},
	} {
		if _, err := loadConfig([]string{up, tt.env}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.40s: error %v, want one containing %s", tt.env, err, tt.want)
		}
	}
	if _, err := loadConfig([]string{up, "UPSTREAM_ID=" + strings.Repeat("a", 512)}); err != nil {
		t.Errorf("UPSTREAM_ID of 512 bytes: %v, want it accepted", err)
	}
}

// TestRequestReadTimeout: REQUEST_READ_TIMEOUT defaults to 10s and must be
// above zero.
func TestRequestReadTimeout(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	cfg, err := loadConfig([]string{up})
	if err != nil || cfg.RequestReadTimeout != 10*time.Second {
		t.Fatalf("default: %v, err %v; want 10s", cfg.RequestReadTimeout, err)
	}
	for _, v := range []string{"0s", "-1s", "soon"} {
		if _, err := loadConfig([]string{up, "REQUEST_READ_TIMEOUT=" + v}); err == nil || !strings.Contains(err.Error(), `REQUEST_READ_TIMEOUT="`+v+`"`) {
			t.Errorf("REQUEST_READ_TIMEOUT=%s: error %v, want one naming it", v, err)
		}
	}
}

// TestTTLNotBelowLock: a record kept for less than its claim's lock is
// refused, globally and per route (the route's ttl= against its own lock=,
// or the global LOCK_TTL it inherits).
func TestTTLNotBelowLock(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"global", []string{up, "TTL=30s", "LOCK_TTL=60s", "SHUTDOWN_TIMEOUT=60s"}, []string{`TTL="30s"`, `LOCK_TTL="60s"`}},
		{"route ttl below global lock", []string{up, "ROUTES=POST /a ttl=30s"}, []string{`ROUTES rule "POST /a ttl=30s"`, "ttl=30s", "LOCK_TTL=60s"}},
		{"route ttl below route lock", []string{up, "ROUTES=POST /a ttl=1m lock=2m"}, []string{`ROUTES rule "POST /a ttl=1m lock=2m"`, "ttl=1m0s", "lock=2m0s"}},
		{"route lock above global TTL", []string{up, "TTL=90s", "ROUTES=POST /a lock=2m"}, []string{`ROUTES rule "POST /a lock=2m"`, "TTL=90s", "lock=2m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env)
			if err == nil {
				t.Fatalf("loadConfig(%q) accepted, want an error", tt.env)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %s:\n%v", w, err)
				}
			}
		})
	}
	for _, ok := range [][]string{
		{up, "TTL=60s", "LOCK_TTL=60s"},
		{up, "ROUTES=POST /a ttl=2m lock=2m; POST /b ttl=1h; POST /c off"},
	} {
		if _, err := loadConfig(ok); err != nil {
			t.Errorf("loadConfig(%q): %v, want it accepted", ok, err)
		}
	}
}

// TestHoldWithFailOpenIsNamed: ON_UNKNOWN=hold promises "never execute
// again without an operator"; FAIL_MODE=open (or a route's fail=open)
// forwards every request while Redis is unreachable, retries of held keys
// included, which then execute again. The two were accepted together
// without a word about it: the generic FAIL_MODE=open warning did not say
// that it voids hold, and a route combining unknown=hold with fail=open got
// no warning at all (only FAIL_MODE was looked at). Config values are
// validated against each other: the combination is refused, or at least
// warned of naming both (as LOCK_TTL against UPSTREAM_TIMEOUT is).
func TestHoldWithFailOpenIsNamed(t *testing.T) {
	for name, env := range map[string][]string{
		"global": {"ON_UNKNOWN=hold", "FAIL_MODE=open"},
		"route":  {"ROUTES=POST /v1/payments/* unknown=hold fail=open"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := loadConfig(append([]string{"UPSTREAM_URL=http://127.0.0.1:9000"}, env...))
			if err != nil {
				if strings.Contains(err.Error(), "hold") {
					return // refused, naming hold: fine
				}
				t.Fatalf("refused without naming hold: %v", err)
			}
			all := strings.Join(cfg.warnings, "\n")
			if !strings.Contains(all, "hold") {
				t.Errorf("%v: warnings %q; want one saying that fail open voids ON_UNKNOWN=hold/unknown=hold while Redis is unreachable", env, cfg.warnings)
			}
		})
	}
}

// TestBufferedSizesBounded: MAX_BODY_BYTES and MAX_STORED_RESPONSE_BYTES are
// at most 64 MiB; the message names the variable, the value and the bound.
func TestBufferedSizesBounded(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, name := range []string{"MAX_BODY_BYTES", "MAX_STORED_RESPONSE_BYTES"} {
		_, err := loadConfig([]string{up, name + "=67108865"})
		if err == nil || !strings.Contains(err.Error(), name+`="67108865"`) || !strings.Contains(err.Error(), "67108864") {
			t.Errorf("%s=67108865: error %v, want one naming the variable, the value and 67108864", name, err)
		}
		if _, err := loadConfig([]string{up, name + "=67108864", "MAX_BUFFERED_BYTES=1073741824"}); err != nil {
			t.Errorf("%s=67108864: %v, want it accepted", name, err)
		}
	}
}

// TestMaxBufferedBytes: MAX_BUFFERED_BYTES must be above zero and hold one
// keyed request's largest body (plus the chunk it is read in) and answer;
// the message names the variables and their values.
func TestMaxBufferedBytes(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	cfg, err := loadConfig([]string{up})
	if err != nil || cfg.MaxBufferedBytes != 32<<20 {
		t.Fatalf("default: %v, MAX_BUFFERED_BYTES %d; want 33554432", err, cfg.MaxBufferedBytes)
	}
	least := fmt.Sprint(2000 + proxy.BodyChunk + 3000)
	for _, tt := range []struct {
		env  []string
		want []string // in the error; nil: accepted
	}{
		{[]string{"MAX_BUFFERED_BYTES=0"}, []string{`MAX_BUFFERED_BYTES="0"`, "above zero"}},
		{[]string{"MAX_BUFFERED_BYTES=-5"}, []string{`MAX_BUFFERED_BYTES="-5"`, "above zero"}},
		{[]string{"MAX_BUFFERED_BYTES=32MiB"}, []string{`MAX_BUFFERED_BYTES="32MiB"`}},
		{[]string{"MAX_BODY_BYTES=2000", "MAX_STORED_RESPONSE_BYTES=3000", "MAX_BUFFERED_BYTES=" + fmt.Sprint(2000+proxy.BodyChunk+2999)},
			[]string{`MAX_BUFFERED_BYTES="` + fmt.Sprint(2000+proxy.BodyChunk+2999) + `"`, `MAX_BODY_BYTES="2000"`, `MAX_STORED_RESPONSE_BYTES="3000"`, "= " + least}},
		{[]string{"MAX_BODY_BYTES=2000", "MAX_STORED_RESPONSE_BYTES=3000", "MAX_BUFFERED_BYTES=" + least}, nil},
		{[]string{"MAX_BODY_BYTES=33554432", "MAX_BUFFERED_BYTES=33554432"}, []string{`MAX_BUFFERED_BYTES="33554432"`, `MAX_BODY_BYTES="33554432"`}},
	} {
		_, err := loadConfig(append([]string{up}, tt.env...))
		if tt.want == nil {
			if err != nil {
				t.Errorf("%v: %v, want it accepted", tt.env, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%v: accepted, want an error", tt.env)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not say %q", tt.env, err, w)
			}
		}
	}
}

// TestMaxBufferedBytesUnsetHoldsOneRequest: MAX_BODY_BYTES and
// MAX_STORED_RESPONSE_BYTES were each valid up to 64 MiB before
// MAX_BUFFERED_BYTES existed. Left unset, its default grows to hold one
// request of those sizes, so that such a configuration still starts (it
// used to exit at start, the chart aside).
func TestMaxBufferedBytesUnsetHoldsOneRequest(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, env := range [][]string{
		{up, "MAX_BODY_BYTES=16777216", "MAX_STORED_RESPONSE_BYTES=16777216"},
		{up, "MAX_BODY_BYTES=33554432"},
		{up, "MAX_STORED_RESPONSE_BYTES=67108864"},
	} {
		cfg, err := loadConfig(env)
		if err != nil {
			t.Errorf("%q (valid before MAX_BUFFERED_BYTES existed, which it does not set): refused at start:\n%v", env[1:], err)
			continue
		}
		if one := cfg.MaxBodyBytes + proxy.BodyChunk + cfg.MaxStoredResponseBytes; cfg.MaxBufferedBytes < one {
			t.Errorf("%q: MAX_BUFFERED_BYTES defaulted to %d, below one request's %d", env[1:], cfg.MaxBufferedBytes, one)
		}
	}
}

// TestRedisAddrsTrimmed: "a:26379, b:26379" is two seeds. Before the fix the
// second was kept as " b:26379", which go-redis cannot dial.
func TestRedisAddrsTrimmed(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, mode := range []string{"sentinel", "cluster"} {
		cfg, err := loadConfig([]string{up, "REDIS_MODE=" + mode, "REDIS_ADDRS= a:26379, b:26379 ,,c:26379,"})
		if err != nil {
			t.Fatalf("%s: loadConfig: %v", mode, err)
		}
		if want := []string{"a:26379", "b:26379", "c:26379"}; !reflect.DeepEqual(cfg.RedisAddrs, want) {
			t.Errorf("%s: REDIS_ADDRS parsed as %q, want %q", mode, cfg.RedisAddrs, want)
		}
	}
	for _, v := range []string{",", " , ,"} {
		_, err := loadConfig([]string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=" + v})
		if err == nil || !strings.Contains(err.Error(), "REDIS_ADDRS=") || !strings.Contains(err.Error(), "no host:port") {
			t.Errorf("REDIS_ADDRS=%q: error %v, want one naming REDIS_ADDRS and saying it holds no host:port", v, err)
		}
	}
	if _, err := loadConfig([]string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=a b:26379"}); err == nil || !strings.Contains(err.Error(), `"a b:26379" is not host:port`) {
		t.Errorf("REDIS_ADDRS with an inner blank: error %v, want one quoting the entry", err)
	}
}

// TestRedisAddrsMustBeHostPort: REDIS_ADDRS is checked only
// for a ':' with something on each side, so a redis:// URL pasted in (the
// form REDIS_URL takes), a port that is not a number, or host:port:junk
// start the proxy; every keyed request then gets 503 at run time instead of
// the process refusing to start with a message naming REDIS_ADDRS.
func TestRedisAddrsMustBeHostPort(t *testing.T) {
	for _, tc := range []struct{ mode, addrs string }{
		{"sentinel", "redis://10.0.0.1:26379"},
		{"cluster", "redis://10.0.0.1:6379,redis://10.0.0.2:6379"},
		{"cluster", "10.0.0.1:port"},
		{"sentinel", "10.0.0.1:26379:1"},
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_MODE=" + tc.mode, "REDIS_ADDRS=" + tc.addrs})
		if err == nil || !strings.Contains(err.Error(), "REDIS_ADDRS") {
			t.Errorf("REDIS_MODE=%s REDIS_ADDRS=%q: loadConfig error %v; want a refusal naming REDIS_ADDRS (not host:port)", tc.mode, tc.addrs, err)
		}
	}
}

// TestRedisAddrsForms: the seed forms a dialer takes are accepted.
func TestRedisAddrsForms(t *testing.T) {
	for _, addrs := range []string{"10.0.0.1:26379", "redis-0.redis:26379, redis-1.redis:26379", "[::1]:6379", "[fd00::1]:26379,10.0.0.2:26379"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_MODE=sentinel", "REDIS_ADDRS=" + addrs}); err != nil {
			t.Errorf("REDIS_ADDRS=%q: %v; want it accepted", addrs, err)
		}
	}
	for _, addrs := range []string{"10.0.0.1:0", "10.0.0.1:65536", "::1:6379", "10.0.0.1", ":6379"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_MODE=cluster", "REDIS_ADDRS=" + addrs}); err == nil || !strings.Contains(err.Error(), "REDIS_ADDRS") {
			t.Errorf("REDIS_ADDRS=%q: %v; want a refusal naming REDIS_ADDRS", addrs, err)
		}
	}
}

// TestRedisURLNegativePoolSizeRefused: REDIS_URL's go-redis options are
// honoured; unchecked, pool_size=-1 passed loadConfig and start then panicked
// inside go-redis ("makechan: size out of range"): the operator got a Go
// panic and a stack, not a message naming REDIS_URL and the value.
func TestRedisURLNegativePoolSizeRefused(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:1/0?pool_size=-1",
		"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR="}
	cfg, err := loadConfig(env)
	if err != nil {
		if !strings.Contains(err.Error(), "REDIS_URL") {
			t.Errorf("loadConfig: %v; want the message to name REDIS_URL", err)
		}
		return
	}
	var startErr error
	panicked := func() (p any) {
		defer func() { p = recover() }()
		a, err := start(cfg, zerolog.Nop())
		startErr = err
		if a != nil {
			_ = a.shutdown(2e9)
		}
		return nil
	}()
	switch {
	case panicked != nil:
		t.Errorf("REDIS_URL=...?pool_size=-1 passed loadConfig and start panicked: %v; want loadConfig to refuse it naming REDIS_URL", panicked)
	case startErr == nil || !strings.Contains(startErr.Error(), "REDIS_URL"):
		t.Errorf("REDIS_URL=...?pool_size=-1: loadConfig accepted it, start returned %v; want a refusal naming REDIS_URL", fmt.Sprint(startErr))
	}
}

// TestRedisURLTimeoutsMustStayOn: go-redis reads a zero or negative
// dial/read/write/pool timeout in REDIS_URL as "no timeout". The claim waits
// on them (go-redis does not put context deadlines on its sockets), so with
// read_timeout=0 a stalled Redis held every keyed request, and the start-up
// check, without end. Such a URL does not start; positive values and the
// defaults do.
func TestRedisURLTimeoutsMustStayOn(t *testing.T) {
	for _, q := range []string{"read_timeout=0", "read_timeout=-1", "write_timeout=0s", "dial_timeout=-5s", "pool_timeout=0"} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://:secret@127.0.0.1:1/0?" + q})
		name, _, _ := strings.Cut(q, "=")
		switch {
		case err == nil:
			t.Errorf("REDIS_URL ...?%s: accepted; want a refusal", q)
		case !strings.Contains(err.Error(), "REDIS_URL") || !strings.Contains(err.Error(), name):
			t.Errorf("REDIS_URL ...?%s: %v; want the message to name REDIS_URL and %s", q, err, name)
		case strings.Contains(err.Error(), "secret"):
			t.Errorf("REDIS_URL ...?%s: the message shows the password: %v", q, err)
		}
	}
	for _, q := range []string{"", "?read_timeout=2s", "?read_timeout=3&write_timeout=1s&dial_timeout=2s&pool_timeout=4s", "?pool_size=0"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:1/0" + q}); err != nil {
			t.Errorf("REDIS_URL ...%s: %v; want it accepted", q, err)
		}
	}
}

// TestSentinelCredentialsOnlyInSentinelMode: elsewhere they are refused,
// by name, and the password is never shown.
func TestSentinelCredentialsOnlyInSentinelMode(t *testing.T) {
	const up, pw = "UPSTREAM_URL=http://127.0.0.1:9", "s3cretPW"
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"password in standalone", []string{up, "REDIS_SENTINEL_PASSWORD=" + pw}, "REDIS_SENTINEL_PASSWORD"},
		{"username in cluster", []string{up, "REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:7000", "REDIS_SENTINEL_USERNAME=u"}, "REDIS_SENTINEL_USERNAME"},
		{"password in cluster", []string{up, "REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:7000", "REDIS_SENTINEL_PASSWORD=" + pw}, "REDIS_SENTINEL_PASSWORD"},
		{"username without password", []string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:26379", "REDIS_SENTINEL_USERNAME=u"}, "REDIS_SENTINEL_PASSWORD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming %s", err, tt.want)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
	cfg, err := loadConfig([]string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:26379", "REDIS_SENTINEL_USERNAME=u", "REDIS_SENTINEL_PASSWORD=" + pw})
	if err != nil || cfg.RedisSentinelUsername != "u" || cfg.RedisSentinelPassword != pw {
		t.Errorf("sentinel mode with both: %v, want them accepted", err)
	}
}

// TestWaitTimeoutCountsAgainstTheLock: with REDIS_WAIT_REPLICAS the claim's
// answer comes back only after WAIT (up to REDIS_WAIT_TIMEOUT), and the lock
// runs from the claim. A lock that does not outlast WAIT and the upstream
// call lets a retry take the claim over while the first request still runs
// (both were forwarded, the key executed twice), so such a configuration
// does not start; the same for a route's lock=, and
// SHUTDOWN_TIMEOUT covers the WAIT too.
func TestWaitTimeoutCountsAgainstTheLock(t *testing.T) {
	base := []string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:1/0?read_timeout=30s"}
	for _, tc := range []struct {
		name string
		env  []string
		want string // "" accepted; else a refusal containing it
	}{
		{"WAIT beyond the lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=15s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"},
			`REDIS_WAIT_TIMEOUT="15s" + UPSTREAM_TIMEOUT="1s" must be below LOCK_TTL="6s"`},
		{"WAIT plus upstream equal to the lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=5s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"},
			`must be below LOCK_TTL="6s"`},
		{"WAIT plus upstream below the lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=4s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"}, ""},
		{"no WAIT: the timeout does not count", []string{"REDIS_WAIT_TIMEOUT=15s", "LOCK_TTL=6s", "UPSTREAM_TIMEOUT=1s"}, ""},
		{"a route's lock", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=3s", "UPSTREAM_TIMEOUT=2s", "ROUTES=POST /v1/* lock=4s"},
			`lock=4s must be above REDIS_WAIT_TIMEOUT="3s" + UPSTREAM_TIMEOUT="2s"`},
		{"a route's lock that outlasts both", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=3s", "UPSTREAM_TIMEOUT=2s", "ROUTES=POST /v1/* lock=6s"}, ""},
		{"shutdown without room for WAIT", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"},
			`SHUTDOWN_TIMEOUT="60s" must be at least REQUEST_READ_TIMEOUT="10s" + UPSTREAM_TIMEOUT="30s" + REDIS_WAIT_TIMEOUT="8s"`},
		{"shutdown with room for WAIT", []string{"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s", "SHUTDOWN_TIMEOUT=64s"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(append(append([]string{}, base...), tc.env...))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted; want a refusal containing %s", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("refusal %v\ndoes not contain %s", err, tc.want)
			}
		})
	}
}

// TestWaitTimeoutVersusURLReadTimeout: a read_timeout= in REDIS_URL that WAIT
// cannot finish within is refused at start, naming both, never the password.
func TestWaitTimeoutVersusURLReadTimeout(t *testing.T) {
	const secret = "s3cretPW"
	_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://:" + secret + "@127.0.0.1:6379/0?read_timeout=2s",
		"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=2s"})
	if err == nil || !strings.Contains(err.Error(), `REDIS_WAIT_TIMEOUT="2s"`) || !strings.Contains(err.Error(), "read_timeout=2s") {
		t.Fatalf("error %v, want one naming REDIS_WAIT_TIMEOUT and read_timeout", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error shows the password: %v", err)
	}
	for _, ok := range []string{"read_timeout=3s", ""} { // (read_timeout=-1, no timeout, is refused: TestRedisURLTimeoutsMustStayOn)
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:6379/0?" + ok,
			"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=2s"}); err != nil {
			t.Errorf("%s: %v, want it accepted", ok, err)
		}
	}
}

// TestShutdownTimeoutCoversRequestReadTimeout: http.Server.Shutdown does
// not cut a request whose body is arriving. One that started just before
// SIGTERM may read for REQUEST_READ_TIMEOUT, call the upstream for
// UPSTREAM_TIMEOUT, then record for 10s; a SHUTDOWN_TIMEOUT shorter than
// that sum exits with its claim in flight, and after LOCK_TTL the client's
// retry executes again. So loadConfig refuses it (the earlier rule, without
// REQUEST_READ_TIMEOUT, accepted 45s against the defaults' 50s).
func TestShutdownTimeoutCoversRequestReadTimeout(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=10s", "SHUTDOWN_TIMEOUT=45s"} // the earlier default
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a keyed request arriving at SIGTERM may need 10s (body) + 30s (upstream) + 10s (record) = 50s > SHUTDOWN_TIMEOUT 45s", env)
	}
	env = []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=5m", "SHUTDOWN_TIMEOUT=40s", "LOCK_TTL=60s"}
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a body may take 5m before its 30s upstream call, SHUTDOWN_TIMEOUT is 40s", env)
	}
}

// TestShutdownTimeoutCoversTheHeaderWindow: on SIGTERM,
// http.Server.Shutdown closes idle connections, but a *new* connection
// (StateNew) is left alone until it is 5 s old (net/http closeIdleConns,
// golang.org/issue/22682; whole Unix seconds, so up to 6 s). A client whose
// headers complete in that window is served normally: its keyed body may
// take REQUEST_READ_TIMEOUT, its claim is written, the upstream call takes
// up to UPSTREAM_TIMEOUT and recording up to 10 s (claim.CompleteBudget). A
// rule counting only REQUEST_READ_TIMEOUT + UPSTREAM_TIMEOUT + 10 s (as it
// once did) lets the process exit at its minimum with that claim in flight,
// and after LOCK_TTL the client's retry executes again: the double execution
// the rule is there to prevent. So the rule adds the header window (6 s).
func TestShutdownTimeoutCoversTheHeaderWindow(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"UPSTREAM_TIMEOUT=30s", "REQUEST_READ_TIMEOUT=10s", "SHUTDOWN_TIMEOUT=50s"}
	if _, err := loadConfig(env); err == nil {
		t.Errorf("loadConfig(%q) accepted: a connection accepted just before SIGTERM may finish its headers up to ~6s later, "+
			"then need 10s (body) + 30s (upstream) + 10s (record) = 56s > SHUTDOWN_TIMEOUT 50s", env)
	}
}

// TestChartGraceDefaultDocumented: values.yaml documents the derived
// terminationGracePeriodSeconds with a helm-docs "@default" annotation; it
// must read ceil(config.shutdownTimeout) + terminationGraceExtraSeconds
// from the same file ("60 + 15 = 75"), as the chart README and README say.
// It once still said "45 + 15 = 60", from an older SHUTDOWN_TIMEOUT default.
func TestChartGraceDefaultDocumented(t *testing.T) {
	b, err := os.ReadFile("charts/idemproxy/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	values := string(b)
	num := func(re string) int {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(values)
		if m == nil {
			t.Fatalf("values.yaml: no match for %s", re)
		}
		if strings.HasSuffix(m[1], "s") {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatal(err)
			}
			return int(d.Seconds())
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	shutdown := num(`(?m)^  shutdownTimeout: (\S+)`)
	extra := num(`(?m)^terminationGraceExtraSeconds: (\d+)`)
	m := regexp.MustCompile(`@default -- null \(derived[^:]*: (\d+) \+ (\d+) = (\d+)\)`).FindStringSubmatch(values)
	if m == nil {
		t.Fatal("values.yaml: no '@default -- null (derived: A + B = C)' annotation")
	}
	want := []string{strconv.Itoa(shutdown), strconv.Itoa(extra), strconv.Itoa(shutdown + extra)}
	if m[1] != want[0] || m[2] != want[1] || m[3] != want[2] {
		t.Errorf("values.yaml documents the derived grace as %s + %s = %s; with shutdownTimeout %ds and terminationGraceExtraSeconds %d it is %s + %s = %s",
			m[1], m[2], m[3], shutdown, extra, want[0], want[1], want[2])
	}
}

// TestSignatureVerificationConfig: verify= names variables that must hold
// the senders' secrets at start (a route that looks verified but is not
// would be the worst outcome); SIGNATURE_TOLERANCE must be positive and
// not above the TTL of a route whose sender signs a timestamp (a captured
// delivery could be sent again after its record expired). No message ever
// quotes a secret.
func TestSignatureVerificationConfig(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	const secret = "Zq7xWebhookS3cret"
	for _, tt := range []struct {
		name string
		env  []string
		want []string // "" : accepted
	}{
		{"github", []string{up, "ROUTES=POST /gh key=github verify=GH_SECRET", "GH_SECRET=" + secret}, nil},
		{"rotation", []string{up, "ROUTES=POST /s key=stripe-events verify=OLD,NEW", "OLD=" + secret, "NEW=" + secret + "2"}, nil},
		{"unset", []string{up, "ROUTES=POST /gh key=github verify=GH_SECRET"}, []string{`ROUTES rule "POST /gh key=github verify=GH_SECRET"`, "GH_SECRET, which is not set"}},
		{"empty", []string{up, "ROUTES=POST /gh key=github verify=GH_SECRET", "GH_SECRET="}, []string{"GH_SECRET, which is empty"}},
		{"one of two unset", []string{up, "ROUTES=POST /gh key=github verify=A,B", "A=" + secret}, []string{"B, which is not set"}},
		{"trailing newline", []string{up, "ROUTES=POST /gh key=github verify=GH_SECRET", "GH_SECRET=" + secret + "\n"}, []string{"GH_SECRET starts or ends with white space"}},
		{"standard webhooks secret not base64", []string{up, "ROUTES=POST /sw key=standard-webhooks verify=SW", "SW=whsec_" + secret + "!!"}, []string{"secret 1 of 1 is not whsec_ followed by base64"}},
		{"verify on a header key", []string{up, "ROUTES=POST /x verify=S", "S=" + secret}, []string{"this rule's key comes from the Idempotency-Key header"}},
		{"tolerance zero", []string{up, "SIGNATURE_TOLERANCE=0s"}, []string{`SIGNATURE_TOLERANCE=0s must be above zero`}},
		{"tolerance not a duration", []string{up, "SIGNATURE_TOLERANCE=5"}, []string{`SIGNATURE_TOLERANCE="5": not a duration`}},
		{"tolerance above a stamped route's ttl", []string{up, "SIGNATURE_TOLERANCE=2h", "ROUTES=POST /s key=stripe-events verify=S ttl=1h", "S=" + secret},
			[]string{"SIGNATURE_TOLERANCE=2h must not be above ttl=1h0m0s"}},
		{"tolerance above TTL", []string{up, "SIGNATURE_TOLERANCE=2h", "TTL=1h", "ROUTES=POST /s key=standard-webhooks verify=S", "S=whsec_" + "c2VjcmV0"},
			[]string{"SIGNATURE_TOLERANCE=2h must not be above TTL=1h"}},
		{"tolerance above TTL, sender signs no timestamp", []string{up, "SIGNATURE_TOLERANCE=2h", "TTL=1h", "ROUTES=POST /gh key=github verify=S", "S=" + secret}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(tt.env)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("loadConfig: %v", err)
				}
				for _, rt := range cfg.routes {
					if rt.Verifier == nil {
						t.Errorf("rule %q: no Verifier built", rt.Rule)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error with %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error quotes a secret: %v", err)
			}
		})
	}
}

// TestLargestJSONBodyFitsTheBufferBudget: a configuration the proxy
// accepts must be able to serve one request of every size it accepts, on
// an idle proxy. With MAX_BODY_BYTES=20MiB, FINGERPRINT=json and
// MAX_BUFFERED_BYTES left at its default, a keyed 16 MiB JSON body (one
// long string: a file upload) is refused 503 overloaded with Retry-After
// although nothing else is in flight, every time: the json profile reserves
// jcs.ScratchBound (about 1.6 times the body, the worst case for a body
// made of tiny members) on top of the body, and the start-up check
// (oneRequestBytes) never counted it. The client retries as told and never
// gets through; the operator sees "overloaded" on an idle replica.
func TestLargestJSONBodyFitsTheBufferBudget(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	a, _ := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL(), "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=",
		"MAX_BODY_BYTES=20971520", "FINGERPRINT=json")
	c := newClient(t)
	body := `{"file":"` + strings.Repeat("A", 16<<20) + `"}`
	r := mustPost(t, c, "http://"+a.proxyAddr.String()+"/v1/uploads", "upload-1", body)
	if r.status != http.StatusCreated {
		t.Errorf("a keyed %d-byte JSON body (MAX_BODY_BYTES=20MiB) on an idle proxy: %d %s, want 201",
			len(body), r.status, firstLine(r.body))
	}
}

// TestRedisURLConnectionStringPasswordNotShown: the contract says a
// password in REDIS_URL is never shown. Azure Cache for Redis hands out its
// access key as a StackExchange.Redis connection string
// ("name.redis.cache.windows.net:6380,password=KEY,ssl=True,abortConnect=False"),
// and operators paste that into REDIS_URL. It is not a URL and must be
// refused, but the refusal (stderr, the pod's log, CI output) must not
// carry the access key, neither in the value it quotes nor in the
// parser's reason.
func TestRedisURLConnectionStringPasswordNotShown(t *testing.T) {
	const key = "AzureAccessKey0123456789abcdefXYZ="
	for _, v := range []string{
		"contoso.redis.cache.windows.net:6380,password=" + key + ",ssl=True,abortConnect=False",
		"redis://contoso.redis.cache.windows.net:6380,password=" + key,
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "REDIS_URL=" + v})
		if err == nil {
			t.Errorf("REDIS_URL=%s accepted", strings.Replace(v, key, "KEY", 1))
			continue
		}
		if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), key[:12]) {
			t.Errorf("the refusal of a connection string shows its password:\n%v", err)
		}
	}
}

// TestRedisURLBadOptionIsNamed: a REDIS_URL whose query has a bad option
// must say which option is wrong. Hiding the query (it may carry
// ?password=) is right, but then the reason has to name the parameter:
// "malformed URL" alone leaves the operator guessing at a value the message
// does not show, with the pod crash-looping.
func TestRedisURLBadOptionIsNamed(t *testing.T) {
	_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"REDIS_URL=redis://127.0.0.1:6379/0?dial_timeout=5seconds&pool_size=20"})
	if err == nil {
		t.Fatal("a bad dial_timeout accepted")
	}
	if !strings.Contains(err.Error(), "dial_timeout") {
		t.Errorf("the refusal does not name the bad option dial_timeout:\n%v", err)
	}
}
