package proxy

import (
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
)

// Policy is the idempotency behaviour applied to one request: the global
// settings, overridden by the ROUTES rule the request matches.
type Policy struct {
	Covered  bool          // enforce keys on this request (METHODS, or a rule naming the method)
	Off      bool          // rule says "off": plain pass-through
	Required bool          // a request without a key gets 400
	TTL      time.Duration // how long a completed response is kept
	LockTTL  time.Duration // how long an in-flight claim holds
	Wait     time.Duration // how long a duplicate waits for the first (0: 409 at once)
	FailOpen bool          // Redis unreachable: forward without guarantee
	Store5xx bool          // record 5xx answers instead of releasing the key
	Upgrade  bool          // rule says "upgrade" (implies off): protocol switches (WebSocket) are tunnelled
	// Key, when set, derives the key from the request (key=SOURCE) instead
	// of reading IDEMPOTENCY_HEADER.
	Key *KeySource
	// Scope, when ScopeSet, replaces SCOPE_HEADERS (scope=; empty: no scope).
	Scope       []string
	ScopeSet    bool
	Fingerprint Fingerprint // FINGERPRINT, or fingerprint=
	// Hold (ON_UNKNOWN=hold, unknown=hold): a key whose outcome is unknown
	// is never executed again without an operator.
	Hold bool
	// Observe (MODE=observe, observe): claim and record first requests, but
	// change no answer; count what enforcing would have done.
	Observe bool
	// Verifier (verify=), when set, checks the sender's signature over the
	// raw body before anything is claimed or forwarded.
	Verifier Verifier
	// ReleaseAuth: a 401 or 403 answer of the upstream is released, not
	// recorded (the default where the key is derived: a stranger who
	// guessed a message id must not have its refusal replayed to the
	// genuine sender), unless the rule says record4xx=all.
	ReleaseAuth bool
}

// Verifier checks a sender's signature (package signature implements it).
type Verifier interface {
	Verify(h http.Header, body []byte, now time.Time) error
}

// verifyPresets are the key presets whose senders sign their deliveries:
// the ones verify= may be combined with.
var verifyPresets = []string{"github", "stripe-events", "standard-webhooks", "shopify"}

// Route is one parsed ROUTES rule. Nil option fields inherit the global
// setting.
type Route struct {
	Method      string
	Pattern     string
	Rule        string // the rule as written, for error messages
	TTL         *time.Duration
	LockTTL     *time.Duration
	Wait        *time.Duration
	Required    bool
	Off         bool
	FailOpen    *bool
	Store5xx    *bool
	Upgrade     bool
	Key         *KeySource
	Scope       *[]string
	Fingerprint *Fingerprint
	Hold        *bool
	Observe     *bool
	// Verify names the variables that hold the sender's secrets (verify=);
	// the caller reads them and sets Verifier.
	Verify   []string
	Verifier Verifier
	// RecordAuth: record4xx=all (true) or record4xx=except-401-403 (false);
	// nil: released where the key is derived, recorded otherwise.
	RecordAuth *bool
}

// apply returns base with the rule's options on top. A rule names its
// method, so the request is covered even when METHODS does not list it.
func (rt *Route) apply(base Policy) Policy {
	p := base
	p.Covered = true
	p.Off = rt.Off
	p.Upgrade = rt.Upgrade
	p.Required = base.Required || rt.Required
	if rt.TTL != nil {
		p.TTL = *rt.TTL
	}
	if rt.LockTTL != nil {
		p.LockTTL = *rt.LockTTL
	}
	if rt.Wait != nil {
		p.Wait = *rt.Wait
	}
	if rt.FailOpen != nil {
		p.FailOpen = *rt.FailOpen
	}
	if rt.Store5xx != nil {
		p.Store5xx = *rt.Store5xx
	}
	if rt.Key != nil {
		p.Key = rt.Key
	}
	if rt.Scope != nil {
		p.Scope, p.ScopeSet = *rt.Scope, true
	}
	if rt.Fingerprint != nil {
		p.Fingerprint = *rt.Fingerprint
	}
	if rt.Hold != nil {
		p.Hold = *rt.Hold
	}
	if rt.Observe != nil {
		p.Observe = *rt.Observe
	}
	p.Verifier = rt.Verifier
	p.ReleaseAuth = p.Key != nil
	if rt.RecordAuth != nil {
		p.ReleaseAuth = !*rt.RecordAuth
	}
	return p
}

var routeMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
	http.MethodTrace: true, http.MethodConnect: true,
}

// ParseRoutes parses the ROUTES variable: rules separated by ";", each a
// method, a chi route pattern and options (ttl=DUR lock=DUR wait=DUR
// required off upgrade fail=open|closed on5xx=release|store key=SOURCE
// scope=H1,H2 fingerprint=strict|json|none unknown=expire|hold observe
// enforce verify=VAR[,VAR2] record4xx=all|except-401-403). Errors quote the
// rule.
func ParseRoutes(spec string) ([]Route, error) {
	var routes []Route
	seen := map[string]string{}
	for raw := range strings.SplitSeq(spec, ";") {
		rule := strings.Join(strings.Fields(raw), " ")
		if rule == "" {
			continue
		}
		rt, err := parseRule(rule)
		if err != nil {
			return nil, fmt.Errorf("ROUTES rule %q: %w", rule, err)
		}
		id := rt.Method + " " + rt.Pattern
		if prev, dup := seen[id]; dup {
			return nil, fmt.Errorf("ROUTES rule %q: %s %s is already covered by rule %q", rule, rt.Method, rt.Pattern, prev)
		}
		seen[id] = rule
		routes = append(routes, rt)
	}
	// Build the router once so a pattern chi rejects fails here, at start.
	if _, err := newRouter(routes); err != nil {
		return nil, err
	}
	return routes, nil
}

func parseRule(rule string) (Route, error) {
	f := strings.Fields(rule)
	if len(f) < 2 {
		return Route{}, fmt.Errorf("want METHOD PATTERN [options]")
	}
	rt := Route{Method: f[0], Pattern: f[1], Rule: rule}
	if !routeMethods[rt.Method] {
		return Route{}, fmt.Errorf("unknown method %q (want an upper-case HTTP method such as POST)", rt.Method)
	}
	if !strings.HasPrefix(rt.Pattern, "/") {
		return Route{}, fmt.Errorf("pattern %q must start with /", rt.Pattern)
	}
	seen := map[string]bool{}
	for _, opt := range f[2:] {
		name, val, hasVal := strings.Cut(opt, "=")
		if seen[name] {
			return Route{}, fmt.Errorf("option %q given twice", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "ttl", "lock", "wait":
			if !hasVal {
				return Route{}, fmt.Errorf("option %q needs a duration, e.g. %s=90s", name, name)
			}
			var d time.Duration
			d, err = time.ParseDuration(val)
			switch {
			case err != nil:
				return Route{}, fmt.Errorf("option %s=%q: not a duration such as 90s or 48h", name, val)
			case d < 0 || (d == 0 && name != "wait"):
				return Route{}, fmt.Errorf("option %s=%q must be above zero", name, val)
			}
			switch name {
			case "ttl":
				rt.TTL = &d
			case "lock":
				rt.LockTTL = &d
			default:
				rt.Wait = &d
			}
		case "observe", "enforce":
			if hasVal {
				return Route{}, fmt.Errorf("option %q takes no value", name)
			}
			if rt.Observe != nil {
				return Route{}, fmt.Errorf("options observe and enforce cannot be combined")
			}
			b := name == "observe"
			rt.Observe = &b
		case "unknown":
			b, ok := map[string]bool{"hold": true, "expire": false}[val]
			if !ok {
				return Route{}, fmt.Errorf("option unknown=%q: want unknown=expire or unknown=hold", val)
			}
			rt.Hold = &b
		case "required", "off", "upgrade":
			if hasVal {
				return Route{}, fmt.Errorf("option %q takes no value", name)
			}
			switch name {
			case "off":
				rt.Off = true
			case "upgrade":
				rt.Upgrade = true
			default:
				rt.Required = true
			}
		case "fail":
			b, ok := map[string]bool{"open": true, "closed": false}[val]
			if !ok {
				return Route{}, fmt.Errorf("option fail=%q: want fail=open or fail=closed", val)
			}
			rt.FailOpen = &b
		case "on5xx":
			b, ok := map[string]bool{"store": true, "release": false}[val]
			if !ok {
				return Route{}, fmt.Errorf("option on5xx=%q: want on5xx=release or on5xx=store", val)
			}
			rt.Store5xx = &b
		case "key":
			if !hasVal {
				return Route{}, fmt.Errorf("option key needs a SOURCE, e.g. key=github or key=header:X-Event-Id")
			}
			ks, err := ParseKeySource(val)
			if err != nil {
				return Route{}, fmt.Errorf("option key=%s: %w", val, err)
			}
			rt.Key = ks
		case "scope":
			if !hasVal {
				return Route{}, fmt.Errorf("option scope needs header names, e.g. scope=X-Tenant-Id, or scope= for no scope")
			}
			names := []string{}
			if val != "" {
				for n := range strings.SplitSeq(val, ",") {
					if !ValidHeaderName(n) {
						return Route{}, fmt.Errorf("option scope=%s: %q is not a header name", val, n)
					}
					names = append(names, n)
				}
			}
			rt.Scope = &names
		case "fingerprint":
			fp, err := ParseFingerprint(val)
			if err != nil {
				return Route{}, fmt.Errorf("option fingerprint=%w", err)
			}
			rt.Fingerprint = &fp
		case "verify":
			if val == "" {
				return Route{}, fmt.Errorf("option verify needs the variables that hold the sender's secrets, e.g. verify=GITHUB_WEBHOOK_SECRET (two, comma-separated, while rotating)")
			}
			for n := range strings.SplitSeq(val, ",") {
				if !validEnvName(n) {
					return Route{}, fmt.Errorf("option verify=%s: %q is not an environment variable name (letters, digits and _, not starting with a digit)", val, n)
				}
				if slices.Contains(rt.Verify, n) {
					return Route{}, fmt.Errorf("option verify=%s: %s is named twice", val, n)
				}
				rt.Verify = append(rt.Verify, n)
			}
		case "record4xx":
			b, ok := map[string]bool{"all": true, "except-401-403": false}[val]
			if !ok {
				return Route{}, fmt.Errorf("option record4xx=%q: want record4xx=all or record4xx=except-401-403", val)
			}
			rt.RecordAuth = &b
		default:
			return Route{}, fmt.Errorf("unknown option %q (want ttl=, lock=, wait=, required, off, upgrade, fail=, on5xx=, record4xx=, key=, scope=, fingerprint=, verify=, unknown=, observe, enforce)", opt)
		}
	}
	if rt.Verify != nil && (rt.Key == nil || !slices.Contains(verifyPresets, rt.Key.Text)) {
		// Only these senders' signatures are known; a signature check the
		// proxy cannot make must not look configured.
		src := "the Idempotency-Key header"
		if rt.Key != nil {
			src = "key=" + rt.Key.Text
		}
		return Route{}, fmt.Errorf("option verify= checks the signature of a sender whose preset is the route's key (key=%s); this rule's key comes from %s", strings.Join(verifyPresets, ", key="), src)
	}
	if rt.Verify != nil && signsBodyOnly[rt.Key.Text] {
		rt.Key = rt.Key.BindBody()
	}
	// A tunnel carries requests past keys and every other option, so a
	// route that allows one is not enforced at all: upgrade implies off.
	if rt.Upgrade {
		rt.Off = true
	}
	if rt.Off && len(f) > 2+btoi(seen["off"])+btoi(rt.Upgrade) {
		return Route{}, fmt.Errorf("options off and upgrade cannot be combined with other options (a route that allows protocol upgrades is a plain pass-through)")
	}
	return rt, nil
}

// validEnvName reports whether s is a portable environment variable name.
func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '_' && !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// router finds the ROUTES rule a request matches, with chi's matching rules
// (most specific pattern wins).
type router struct {
	mux    *chi.Mux
	byID   map[string]*Route // "METHOD pattern" -> rule
	ctxs   sync.Pool
	routes []Route
}

func newRouter(routes []Route) (r *router, err error) {
	r = &router{mux: chi.NewMux(), byID: map[string]*Route{}, routes: routes}
	r.ctxs.New = func() any { return chi.NewRouteContext() }
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for i := range routes {
		rt := &routes[i]
		func() {
			// chi panics on a pattern it cannot parse; report it as the rule's error.
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("ROUTES rule %q: bad pattern %q: %v", rt.Rule, rt.Pattern, p)
				}
			}()
			r.mux.Method(rt.Method, rt.Pattern, noop)
		}()
		if err != nil {
			return nil, err
		}
		r.byID[rt.Method+" "+rt.Pattern] = rt
	}
	return r, nil
}

// match returns the rule for req, or nil when none matches.
func (r *router) match(req *http.Request) *Route {
	if len(r.routes) == 0 {
		return nil
	}
	// Match a normalised path (RFC 3986 section 6.2.2): /v1/pay%6Dents/x,
	// //v1/payments/x and /v1/./payments/x must not slip past a rule for
	// /v1/payments/*. An encoded slash (%2F) stays encoded: it is not a
	// separator, so /v1/payments/..%2Fwebhooks cannot reach another rule.
	p := normalisePath(req.URL.EscapedPath())
	trailing := len(p) > 1 && p[len(p)-1] == '/'
	p = path.Clean(p)
	rctx := r.ctxs.Get().(*chi.Context)
	rctx.Reset()
	pattern := ""
	if trailing && p != "/" { // "/v1/payments/" must still match "/v1/payments/*"
		pattern = r.mux.Find(rctx, req.Method, p+"/")
		rctx.Reset()
	}
	if pattern == "" {
		pattern = r.mux.Find(rctx, req.Method, p)
	}
	r.ctxs.Put(rctx)
	if pattern == "" {
		return nil
	}
	return r.byID[req.Method+" "+pattern]
}

// normalisePath decodes the percent-escapes of unreserved characters
// (letters, digits, "-", ".", "_", "~"), upper-cases the others and makes
// the path absolute. Repeated slashes and dot segments are removed by the
// caller (path.Clean).
func normalisePath(escaped string) string {
	if strings.HasPrefix(escaped, "/") && strings.IndexByte(escaped, '%') < 0 {
		return escaped
	}
	var b strings.Builder
	b.Grow(len(escaped) + 1)
	if !strings.HasPrefix(escaped, "/") {
		b.WriteByte('/')
	}
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		if c == '%' && i+2 < len(escaped) && isHex(escaped[i+1]) && isHex(escaped[i+2]) {
			v := unhex(escaped[i+1])<<4 | unhex(escaped[i+2])
			if isUnreserved(v) {
				b.WriteByte(v)
			} else {
				b.WriteByte('%')
				b.WriteByte(upper(escaped[i+1]))
				b.WriteByte(upper(escaped[i+2]))
			}
			i += 2
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
