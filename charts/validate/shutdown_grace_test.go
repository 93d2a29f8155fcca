package validate

import (
	"strings"
	"testing"
)

// TestPreStopCountsInTheGrace: Kubernetes counts a preStop
// hook inside terminationGracePeriodSeconds: SIGTERM comes only after the
// hook, and SIGKILL at the grace period after the start of termination.
// The chart derives the grace as ceil(SHUTDOWN_TIMEOUT) + 15 s and refuses
// an explicit one not above SHUTDOWN_TIMEOUT ("Kubernetes would SIGKILL the
// proxy before in-flight requests are recorded"), and values.yaml suggests a
// preStop sleep -- but neither the derivation nor the check looks at it.
// With lifecycle.preStop.sleep.seconds=30 (the usual endpoint-propagation
// sleep on a busy cluster) the pod gets SIGTERM at 30 s and SIGKILL at 75 s:
// 45 s of the 60 s drain the proxy was promised (and that its own start-up
// check requires: REQUEST_READ_TIMEOUT + UPSTREAM_TIMEOUT + 16 s = 56 s).
// A request in its upstream call then dies unrecorded and its retry
// executes again after LOCK_TTL (or is held unknown). The render succeeds.
func TestPreStopCountsInTheGrace(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"derived grace, preStop sleep 30s", []string{"--set", "lifecycle.preStop.sleep.seconds=30"}},
		{"explicit grace 61s, preStop sleep 15s", []string{"--set", "lifecycle.preStop.sleep.seconds=15", "--set", "terminationGracePeriodSeconds=61"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, tc.args...)
			if err != nil {
				return // refused: fine
			}
			m := decodeAll(t, out)
			spec := m.deployment.Spec.Template.Spec
			var preStop int64
			if lc := spec.Containers[0].Lifecycle; lc != nil && lc.PreStop != nil && lc.PreStop.Sleep != nil {
				preStop = lc.PreStop.Sleep.Seconds
			}
			const shutdown = 60 // config.shutdownTimeout default
			if g := spec.TerminationGracePeriodSeconds; g == nil || *g < preStop+shutdown {
				t.Errorf("%s: rendered terminationGracePeriodSeconds=%s with a %ds preStop sleep and SHUTDOWN_TIMEOUT=60s: SIGKILL %ds into a drain promised 60s (the proxy refuses to start with less than 56s); want the grace to cover preStop + SHUTDOWN_TIMEOUT (or the render to fail)",
					strings.Join(tc.args, " "), ptrString(g), preStop, *g-preStop)
			}
		})
	}
}

// TestLoopbackListenersRefused: config.listenAddr and
// config.adminAddr are checked for a port only. A host part of 127.0.0.1
// (or localhost) renders and starts: with adminAddr the kubelet's probes to
// the pod IP are refused and the pod is restarted forever; with listenAddr
// the Service's traffic is refused while /readyz (on the admin listener)
// says ready -- the pod stays in the Service and every request fails. The
// chart's own comment says both must listen on every interface; the render
// should refuse it, as it refuses an empty adminAddr.
func TestLoopbackListenersRefused(t *testing.T) {
	for _, set := range []string{"config.adminAddr=127.0.0.1:9090", "config.listenAddr=127.0.0.1:8080", "config.listenAddr=localhost:8080"} {
		if _, err := render(t, "--set", set); err == nil {
			t.Errorf("helm template --set %s: rendered; want a refusal (a loopback listener is unreachable from the kubelet and the Service)", set)
		}
	}
}

// TestWaitTimeoutCountsAgainstTheLock mirrors the proxy's start-up check:
// with redisWaitReplicas, WAIT holds back the claim's answer, so
// redisWaitTimeout + upstreamTimeout must be below lockTTL and every route's
// lock, and the shutdown must cover the WAIT.
func TestWaitTimeoutCountsAgainstTheLock(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // "" renders; else the error contains it
	}{
		{"WAIT beyond the lock", []string{"--set", "config.redisWaitReplicas=1", "--set", "config.redisWaitTimeout=15s", "--set", "config.lockTTL=40s"},
			"REDIS_WAIT_TIMEOUT=15s) + config.upstreamTimeout (UPSTREAM_TIMEOUT=30s) must be below config.lockTTL (LOCK_TTL=40s)"},
		{"WAIT within the lock", []string{"--set", "config.redisWaitReplicas=1", "--set", "config.redisWaitTimeout=5s", "--set", "config.lockTTL=40s", "--set", "config.shutdownTimeout=61s"}, ""},
		{"no WAIT: the timeout does not count", []string{"--set", "config.redisWaitTimeout=15s", "--set", "config.lockTTL=40s"}, ""},
		{"a route's lock", []string{"--set", "config.redisWaitReplicas=1", "--set", "config.redisWaitTimeout=5s", "--set", "config.shutdownTimeout=61s",
			"--set", "config.routes[0].method=post", "--set", "config.routes[0].pattern=/v1/*", "--set", "config.routes[0].lock=33s"},
			"lock=33s must be above config.redisWaitTimeout"},
		{"shutdown without room for WAIT", []string{"--set", "config.redisWaitReplicas=1", "--set", "config.redisWaitTimeout=5s"},
			"config.shutdownTimeout (SHUTDOWN_TIMEOUT=60s) must be at least"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.args...)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("rendered; want a refusal containing %s", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("refusal %v\ndoes not contain %s", err, tc.want)
			}
		})
	}
}
