package proxy

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/claim"
)

// Outcomes, the `outcome` label of idemproxy_requests_total and the
// `outcome` field of the access log.
const (
	outcomeExecuted         = "executed"          // claimed, forwarded, recorded
	outcomeTakeover         = "takeover"          // as executed, after taking over an expired claim
	outcomeReplayed         = "replayed"          // answered from the record
	outcomeInFlight         = "in_flight"         // 409: the first is still running
	outcomeMismatch         = "mismatch"          // 422: key reused for another request
	outcomeInvalid          = "invalid"           // 400: key missing (required), malformed; unreadable body
	outcomeTooLarge         = "too_large"         // 413: request body over MAX_BODY_BYTES
	outcomeOverloaded       = "overloaded"        // 503: MAX_BUFFERED_BYTES reached, the request not let in or its replay refused
	outcomeStoreError       = "store_error"       // 503 (fail closed), or the answer could not be recorded
	outcomeFailOpen         = "fail_open"         // Redis unreachable, forwarded without guarantee
	outcomeReleased         = "released"          // upstream 5xx or never reached: claim freed for a retry
	outcomeUpstreamError    = "upstream_error"    // timeout or broken answer after sending: claim kept
	outcomePassthrough      = "passthrough"       // method not covered, or route "off"
	outcomeNoKey            = "no_key"            // covered, no key, key not required: forwarded as is
	outcomeLost             = "lost"              // our claim expired and was taken over: the key executed twice
	outcomeUnknown          = "unknown"           // the key's outcome is unknown (ON_UNKNOWN=hold): answered 502/504, not executed
	outcomeSignatureInvalid = "signature_invalid" // 401: the sender's signature does not verify (verify=); nothing claimed

	// Observe mode (MODE=observe, route observe): forwarded unchanged,
	// counted as what enforcing would have answered.
	outcomeWouldReplay   = "would_replay"   // a replay (or an unknown outcome's answer)
	outcomeWouldConflict = "would_conflict" // 409: the first was still in flight
	outcomeWouldMismatch = "would_mismatch" // 422: key reused for another request
	outcomeWouldReject   = "would_reject"   // 400/408/413: invalid or missing required key, body too large or too slow
)

// Causes of an unknown outcome, the `cause` label of
// idemproxy_unknown_outcomes_total.
const (
	causeUpstreamTimeout = "upstream_timeout" // the upstream timed out after the request was sent (504)
	causeUpstreamFailed  = "upstream_failed"  // the connection broke or the answer was malformed after sending (502)
	causeLockExpired     = "lock_expired"     // an in-flight claim's lock expired: its proxy died or lost Redis (504)
)

// Metrics are the proxy's Prometheus series.
type Metrics struct {
	requests         *prometheus.CounterVec
	responses        *prometheus.CounterVec
	upstream         *prometheus.HistogramVec
	script           *prometheus.HistogramVec
	inflight         prometheus.Gauge
	recordFailures   prometheus.Counter
	doubleExecutions prometheus.Counter
	takeoverAge      prometheus.Histogram
	cacheHits        prometheus.Counter
	unknownOutcomes  *prometheus.CounterVec
	bufferFull       prometheus.Counter
	bodyNotJSON      *prometheus.CounterVec
	// bufferedBytes is the Handler's MAX_BUFFERED_BYTES count, read by the
	// idemproxy_buffered_bytes gauge at each scrape (watchBuffered).
	bufferedBytes atomic.Pointer[atomic.Int64]

	mu       sync.RWMutex
	counted  map[[4]string]prometheus.Counter  // (family, route, label, key source) -> series
	observed map[[3]string]prometheus.Observer // (family, label, label) -> histogram series
}

// countRequest increments idemproxy_requests_total.
func (m *Metrics) countRequest(route, outcome, keySource string) {
	m.countKey([4]string{"requests", route, outcome, keySource}, func() prometheus.Counter {
		return m.requests.WithLabelValues(route, outcome, keySource)
	})
}

// count increments a request or response series. The series are looked up
// by label values once and kept: WithLabelValues hashes its labels on every
// call, and there are few combinations (routes are ROUTES patterns).
func (m *Metrics) count(vec *prometheus.CounterVec, family, route, label string) {
	m.countKey([4]string{family, route, label}, func() prometheus.Counter { return vec.WithLabelValues(route, label) })
}

func (m *Metrics) countKey(k [4]string, series func() prometheus.Counter) {
	m.mu.RLock()
	c, ok := m.counted[k]
	m.mu.RUnlock()
	if !ok {
		c = series()
		m.mu.Lock()
		m.counted[k] = c
		m.mu.Unlock()
	}
	c.Inc()
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		counted:  map[[4]string]prometheus.Counter{},
		observed: map[[3]string]prometheus.Observer{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_requests_total",
			Help: "Requests handled, by ROUTES pattern (\"default\" when no rule matched), outcome and where the key came from (header, derived, none).",
		}, []string{"route", "outcome", "key_source"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_responses_total",
			Help: "Responses sent, by ROUTES pattern and HTTP status code.",
		}, []string{"route", "code"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_upstream_duration_seconds",
			Help:    "Time from sending a request upstream to its response headers, by route and status class (\"error\": no answer, or a status above 599).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"route", "code_class"}),
		script: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_redis_script_duration_seconds",
			Help:    "Redis Lua script round trips, by script (claim, complete, release) and result.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"script", "result"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_inflight_requests",
			Help: "Requests being handled right now.",
		}),
		recordFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_record_failures_total",
			Help: "Upstream answers that could not be recorded (Redis lost after retries); their keys stay in flight until the lock TTL.",
		}),
		doubleExecutions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_double_executions_total",
			Help: "Keys known to have executed twice: this request's claim expired and another request took it over before the answer could be recorded.",
		}),
		takeoverAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemproxy_takeover_claim_age_seconds",
			Help:    "Age of the abandoned claim when a request took it over.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_replay_cache_hits_total",
			Help: "Replays answered from this process's memory, without a Redis round trip.",
		}),
	}
	m.unknownOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_unknown_outcomes_total",
		Help: "Keys that entered the state unknown (ON_UNKNOWN=hold: held for an operator, never executed again), by cause (upstream_timeout, upstream_failed, lock_expired).",
	}, []string{"cause"})
	for _, c := range []string{causeUpstreamTimeout, causeUpstreamFailed, causeLockExpired} {
		m.unknownOutcomes.WithLabelValues(c) // exported at zero: alerts see the series before the first one
	}
	m.bufferFull = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idemproxy_buffer_full_total",
		Help: "Keyed requests answered 503 overloaded because MAX_BUFFERED_BYTES had no room for their body or their replay (nothing executed).",
	})
	m.bodyNotJSON = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_key_body_not_json_total",
		Help: "Requests on a route whose key=SOURCE reads the body (json:) whose body was not JSON, so that no key could be read (forwarded without guarantee, or 400 when required), by route.",
	}, []string{"route"})
	buffered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_buffered_bytes",
		Help: "Bytes of keyed request bodies, answers being recorded and replays held in memory now, counted against MAX_BUFFERED_BYTES.",
	}, func() float64 {
		if p := m.bufferedBytes.Load(); p != nil {
			return float64(p.Load())
		}
		return 0
	})
	// The outcomes the alerts watch, exported at zero for the default route
	// and header keys: a series the proxy creates at its first increment is
	// first scraped at 1 or more, where rate() and increase() see nothing.
	for _, o := range []string{outcomeStoreError, outcomeFailOpen, outcomeUnknown} {
		m.requests.WithLabelValues("default", o, keySourceHeader)
	}
	reg.MustRegister(m.requests, m.responses, m.upstream, m.script, m.inflight, m.recordFailures, m.doubleExecutions, m.takeoverAge, m.cacheHits, m.unknownOutcomes,
		m.bufferFull, m.bodyNotJSON, buffered)
	return m
}

// watchBuffered makes idemproxy_buffered_bytes report used.
func (m *Metrics) watchBuffered(used *atomic.Int64) { m.bufferedBytes.Store(used) }

// ObserveScript is a claim.Observer.
func (m *Metrics) ObserveScript(ev claim.Event) {
	if ev.Op == claim.OpCacheHit {
		m.cacheHits.Inc()
		return
	}
	m.observe(m.script, "script", string(ev.Op), ev.Result, ev.Duration)
}

// statusClasses are the upstream histogram's class labels by status/100. Go's
// client also accepts 600 to 999; the proxy handles those as failures (as a
// 5xx: released, unless ON_5XX=store), so they count as "error" with the
// answers that never came, where an alert on failures looks.
var statusClasses = [...]string{1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}

func (m *Metrics) observeUpstream(route string, status int, d time.Duration) {
	class := "error"
	if status >= 100 && status < 600 {
		class = statusClasses[status/100]
	}
	m.observe(m.upstream, "upstream", route, class, d)
}

// observe records d in vec's series for the two label values, looked up
// once and kept, as count does for counters: a first request observes
// three histograms.
func (m *Metrics) observe(vec *prometheus.HistogramVec, family, a, b string, d time.Duration) {
	k := [3]string{family, a, b}
	m.mu.RLock()
	o, ok := m.observed[k]
	m.mu.RUnlock()
	if !ok {
		o = vec.WithLabelValues(a, b)
		m.mu.Lock()
		m.observed[k] = o
		m.mu.Unlock()
	}
	o.Observe(d.Seconds())
}

// statusText is strconv.Itoa without an allocation for the usual codes.
func statusText(code int) string {
	if code >= 100 && code < 600 {
		return statusCodes[code-100]
	}
	return strconv.Itoa(code)
}

var statusCodes = func() (s [500]string) {
	for i := range s {
		s[i] = strconv.Itoa(i + 100)
	}
	return s
}()
