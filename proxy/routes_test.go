package proxy

import (
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseRoutes(t *testing.T) {
	t.Parallel()
	spec := `POST /v1/payments/*  ttl=48h lock=2m required;
	         POST /v1/orders      ttl=1h wait=5s fail=open on5xx=store;
	         POST /v1/webhooks/*  off ;
	         PATCH /v1/orders/{id} wait=0s fail=closed on5xx=release;`
	routes, err := ParseRoutes(spec)
	if err != nil {
		t.Fatalf("ParseRoutes: %v", err)
	}
	if len(routes) != 4 {
		t.Fatalf("got %d routes, want 4", len(routes))
	}
	p := routes[0]
	if p.Method != "POST" || p.Pattern != "/v1/payments/*" || *p.TTL != 48*time.Hour || *p.LockTTL != 2*time.Minute || !p.Required {
		t.Errorf("payments rule: got %+v", p)
	}
	o := routes[1]
	if *o.TTL != time.Hour || *o.Wait != 5*time.Second || !*o.FailOpen || !*o.Store5xx || o.LockTTL != nil {
		t.Errorf("orders rule: got %+v", o)
	}
	if !routes[2].Off {
		t.Errorf("webhooks rule: got %+v, want off", routes[2])
	}
	if q := routes[3]; *q.Wait != 0 || *q.FailOpen || *q.Store5xx {
		t.Errorf("patch rule: got %+v", q)
	}
	opts, err := ParseRoutes("POST /a unknown=hold observe; POST /b unknown=expire enforce; POST /c")
	if err != nil {
		t.Fatal(err)
	}
	base := Policy{Hold: true, Observe: true}
	for i, want := range []struct{ hold, observe bool }{{true, true}, {false, false}, {true, true}} {
		if p := opts[i].apply(base); p.Hold != want.hold || p.Observe != want.observe {
			t.Errorf("rule %q over hold and observe: Hold %v Observe %v, want %v %v", opts[i].Rule, p.Hold, p.Observe, want.hold, want.observe)
		}
	}
	if p := opts[0].apply(Policy{}); !p.Hold || !p.Observe {
		t.Errorf("rule %q over the defaults: %+v, want hold and observe", opts[0].Rule, p)
	}
	if r, err := ParseRoutes("  ;  "); err != nil || len(r) != 0 {
		t.Errorf("blank ROUTES: got %v, %v; want none", r, err)
	}
}

func TestParseRoutesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ spec, want string }{
		{"POST", `"POST": want METHOD PATTERN`},
		{"post /x", `unknown method "post"`},
		{"FETCH /x", `unknown method "FETCH"`},
		{"POST x", `must start with /`},
		{"POST /x ttl", `needs a duration`},
		{"POST /x ttl=5", `ttl="5": not a duration`},
		{"POST /x ttl=0s", `must be above zero`},
		{"POST /x lock=-1s", `must be above zero`},
		{"POST /x wait=-1s", `must be above zero`},
		{"POST /x fail=maybe", `want fail=open or fail=closed`},
		{"POST /x on5xx=keep", `want on5xx=release or on5xx=store`},
		{"POST /x required=yes", `takes no value`},
		{"POST /x retries=3", `unknown option "retries=3"`},
		{"POST /x ttl=1h ttl=2h", `given twice`},
		{"POST /x off ttl=1h", `cannot be combined`},
		{"POST /x; POST /x ttl=1h", `already covered by rule "POST /x"`},
		{"POST /x/*/y", `bad pattern`},
		{"POST /{id", `bad pattern`},
		{"POST /x unknown=retry", `want unknown=expire or unknown=hold`},
		{"POST /x unknown", `want unknown=expire or unknown=hold`},
		{"POST /x observe=yes", `option "observe" takes no value`},
		{"POST /x observe enforce", `observe and enforce cannot be combined`},
		{"POST /x off observe", `cannot be combined`},
		{"POST /x upgrade unknown=hold", `cannot be combined`},
		{"POST /x key=github verify", `needs the variables`},
		{"POST /x key=github verify=", `needs the variables`},
		{"POST /x key=github verify=1SECRET", `not an environment variable name`},
		{"POST /x key=github verify=A-B", `not an environment variable name`},
		{"POST /x key=github verify=A,A", `A is named twice`},
		{"POST /x verify=SECRET", `this rule's key comes from the Idempotency-Key header`},
		{"POST /x key=sns verify=SECRET", `this rule's key comes from key=sns`},
		{"POST /x key=header:X-GitHub-Delivery verify=SECRET", `this rule's key comes from key=header:X-GitHub-Delivery`},
		{"POST /x key=github off verify=S", `cannot be combined`},
		{"POST /x record4xx=none", `want record4xx=all or record4xx=except-401-403`},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			_, err := ParseRoutes(tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseRoutes(%q) error = %v, want it to contain %q", tt.spec, err, tt.want)
			}
			if !strings.Contains(err.Error(), "ROUTES rule") {
				t.Errorf("error %q does not say which ROUTES rule", err)
			}
		})
	}
}

func TestRouterMatch(t *testing.T) {
	t.Parallel()
	routes, err := ParseRoutes(`POST /v1/payments/* ttl=48h; POST /v1/payments/refunds off; POST /v1/orders/{id} ttl=1h; PUT /v1/orders/{id} required`)
	if err != nil {
		t.Fatal(err)
	}
	rtr, err := newRouter(routes)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ method, path, want string }{
		{"POST", "/v1/payments/abc", "/v1/payments/*"},
		{"POST", "/v1/payments/a/b/c", "/v1/payments/*"},
		{"POST", "/v1/payments/refunds", "/v1/payments/refunds"},
		{"POST", "/v1/orders/42", "/v1/orders/{id}"},
		{"PUT", "/v1/orders/42", "/v1/orders/{id}"},
		{"GET", "/v1/orders/42", ""},
		{"POST", "/v1/orders", ""},
		{"POST", "/other", ""},
		// Other spellings of a covered path match the same rule.
		{"POST", "/v1/pay%6Dents/abc", "/v1/payments/*"},
		{"POST", "/v1/payments/", "/v1/payments/*"},
		{"POST", "/v1/payments/%61bc", "/v1/payments/*"},
		// An encoded slash is not a separator (RFC 3986): it neither joins
		// nor escapes a rule.
		{"POST", "/v1/payments%2Fabc", ""},
		{"POST", "/v1/payments/..%2Frefunds", "/v1/payments/*"},
		{"POST", "/v1/payments/..%2frefunds", "/v1/payments/*"},
		{"POST", "//v1/payments/abc", "/v1/payments/*"},
		{"POST", "/v1/./payments/abc", "/v1/payments/*"},
		{"POST", "/v1/x/../payments/refunds", "/v1/payments/refunds"},
		{"POST", "/v1/orders/42/", "/v1/orders/{id}"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			got := ""
			if rt := rtr.match(httptest.NewRequest(tt.method, tt.path, nil)); rt != nil {
				got = rt.Pattern
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRouteApply(t *testing.T) {
	t.Parallel()
	base := Policy{TTL: time.Hour, LockTTL: time.Minute, Wait: 3 * time.Second, FailOpen: true, Store5xx: true}
	routes, err := ParseRoutes("PATCH /x wait=0s fail=closed on5xx=release lock=2m")
	if err != nil {
		t.Fatal(err)
	}
	got := routes[0].apply(base)
	want := Policy{Covered: true, TTL: time.Hour, LockTTL: 2 * time.Minute}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestRouteReleasesAuthWhereKeyIsDerived: where the key comes from the
// message (key=), whoever sends a message id first holds it, so an
// upstream's 401 or 403 is released by default; record4xx= says otherwise
// either way. Header-key routes record them, as before.
func TestRouteReleasesAuthWhereKeyIsDerived(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]bool{
		"POST /x":                                     false,
		"POST /x key=github":                          true,
		"POST /x key=json:/id scope=":                 true,
		"POST /x key=github record4xx=all":            false,
		"POST /x record4xx=except-401-403":            true,
		"POST /x key=github record4xx=except-401-403": true,
	} {
		routes, err := ParseRoutes(spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := routes[0].apply(Policy{}).ReleaseAuth; got != want {
			t.Errorf("%s: ReleaseAuth %v, want %v", spec, got, want)
		}
	}
	if (Policy{}).ReleaseAuth {
		t.Error("the global policy releases 401 and 403")
	}
}

// FuzzParseRoutes: never panics (chi panics on bad patterns; ParseRoutes
// must turn that into an error), and what parses builds a router.
func FuzzParseRoutes(f *testing.F) {
	for _, s := range []string{"POST /x ttl=1h", "POST /v1/*; PUT /{id} off", "POST /{", "POST /*/x", "GET /a/{b:[0-9]+}", ";;", "POST /x wait=1s fail=open on5xx=store required"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		routes, err := ParseRoutes(spec)
		if err != nil {
			return
		}
		if _, err := newRouter(routes); err != nil {
			t.Fatalf("ParseRoutes(%q) accepted rules the router rejects: %v", spec, err)
		}
	})
}

func TestNormalisePath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/v1/orders":        "/v1/orders",
		"v1/orders":         "/v1/orders",
		"/v1/%6Frders":      "/v1/orders",
		"/v1/a%2fb":         "/v1/a%2Fb",
		"/v1/%7e%2D%5F%2E":  "/v1/~-_.",
		"/v1/%":             "/v1/%",
		"/v1/%zz":           "/v1/%zz",
		"/v1/%41%42%43/%20": "/v1/ABC/%20",
	} {
		if got := normalisePath(in); got != want {
			t.Errorf("normalisePath(%q) = %q, want %q", in, got, want)
		}
	}
}
