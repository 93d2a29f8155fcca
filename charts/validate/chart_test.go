package validate

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// contractVars are the environment variables of shared/contract.md (plus REDIS_WAIT_* and
// the proxy's own, such as RECORD_FORMAT)
// that the chart's ConfigMap must carry. The Redis credentials are deliberately absent: they
// come from a Secret.
var contractVars = []string{
	"UPSTREAM_URL", "LISTEN_ADDR", "ADMIN_ADDR", "REDIS_MODE", "REDIS_ADDRS", "REDIS_MASTER_NAME",
	"REDIS_TLS", "REDIS_WAIT_REPLICAS", "REDIS_WAIT_TIMEOUT", "REDIS_AUTOPIPELINE", "REPLAY_CACHE_BYTES", "KEY_PREFIX", "RECORD_FORMAT", "IDEMPOTENCY_HEADER", "METHODS", "TTL",
	"LOCK_TTL", "UPSTREAM_TIMEOUT", "UPSTREAM_ID", "REQUEST_READ_TIMEOUT", "REQUIRE_KEY", "MAX_KEY_LENGTH", "MAX_BODY_BYTES",
	"MAX_STORED_RESPONSE_BYTES", "MAX_BUFFERED_BYTES", "GOMEMLIMIT_RATIO", "SCOPE_HEADERS", "FINGERPRINT", "FAIL_MODE", "WAIT_TIMEOUT", "ON_5XX", "ON_UNKNOWN", "MODE", "DOCS_URL", "SIGNATURE_TOLERANCE", "ROUTES",
	"LOG_LEVEL", "LOG_FORMAT", "SHUTDOWN_TIMEOUT",
}

var secretVars = []string{"REDIS_URL", "REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_SENTINEL_USERNAME", "REDIS_SENTINEL_PASSWORD"}

// dashboardMetrics are the series the Grafana dashboard must query.
var dashboardMetrics = []string{
	"idemproxy_requests_total", "idemproxy_responses_total", "idemproxy_upstream_duration_seconds_bucket",
	"idemproxy_redis_script_duration_seconds_bucket", "idemproxy_inflight_requests",
	"idemproxy_record_failures_total", "idemproxy_takeover_claim_age_seconds_bucket",
	"idemproxy_build_info", "idemproxy_store_unsafe", "idemproxy_double_executions_total",
	"idemproxy_unknown_outcomes_total", "idemproxy_ready",
}

// TestRenderStrict renders the default values and every ci/*-values.yaml, decodes each
// manifest strictly into its k8s.io/api type and checks what must hold in every render.
func TestRenderStrict(t *testing.T) {
	for _, tc := range valuesCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := mustRender(t, tc.args...)
			checkNames(t, m)
			cm := checkConfigMap(t, m)
			checkDeployment(t, m, cm)
			checkService(t, m)
			checkRefs(t, m)
			checkTestPod(t, m)
		})
	}
}

func checkNames(t *testing.T, m *manifests) {
	t.Helper()
	for id, obj := range m.all {
		meta := obj.(metav1.ObjectMetaAccessor).GetObjectMeta()
		for _, msg := range validation.IsDNS1123Subdomain(meta.GetName()) {
			t.Errorf("%s: name: %s", id, msg)
		}
		if strings.HasPrefix(id, "Service/") {
			for _, msg := range validation.IsDNS1035Label(meta.GetName()) {
				t.Errorf("%s: Service name: %s", id, msg)
			}
		}
		for k, v := range meta.GetLabels() {
			for _, msg := range validation.IsQualifiedName(k) {
				t.Errorf("%s: label key %q: %s", id, k, msg)
			}
			for _, msg := range validation.IsValidLabelValue(v) {
				t.Errorf("%s: label %s=%q: %s", id, k, v, msg)
			}
		}
		for k := range meta.GetAnnotations() {
			for _, msg := range validation.IsQualifiedName(strings.ToLower(k)) {
				t.Errorf("%s: annotation key %q: %s", id, k, msg)
			}
		}
	}
}

// checkConfigMap checks the proxy's ConfigMap carries every contract variable and no
// credential, and returns it.
func checkConfigMap(t *testing.T, m *manifests) *corev1.ConfigMap {
	t.Helper()
	cm := m.configMap(m.deployment.Name)
	if cm == nil {
		t.Fatalf("no ConfigMap named %s", m.deployment.Name)
	}
	for _, v := range contractVars {
		if _, ok := cm.Data[v]; !ok {
			t.Errorf("ConfigMap lacks %s", v)
		}
	}
	for k := range cm.Data {
		if !slices.Contains(contractVars, k) {
			t.Errorf("ConfigMap has %s, which is not a contract variable", k)
		}
	}
	for _, v := range secretVars {
		if _, ok := cm.Data[v]; ok {
			t.Errorf("ConfigMap holds %s: Redis credentials must come from a Secret", v)
		}
	}
	for _, c := range m.configMaps {
		for k, v := range c.Data {
			if regexp.MustCompile(`rediss?://[^@\s]*:[^@\s]+@`).MatchString(v) {
				t.Errorf("ConfigMap %s key %s holds a Redis URL with a password", c.Name, k)
			}
		}
	}
	return cm
}

func parseDuration(t *testing.T, name, v string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

func checkDeployment(t *testing.T, m *manifests, cm *corev1.ConfigMap) {
	t.Helper()
	d := m.deployment
	pod := d.Spec.Template

	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		t.Fatalf("Deployment selector: %v", err)
	}
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Deployment selector %v does not match the pod labels %v", sel, pod.Labels)
	}

	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(pod.Annotations["checksum/config"]) {
		t.Errorf("pod annotation checksum/config = %q, want a sha256", pod.Annotations["checksum/config"])
	}

	shutdown := parseDuration(t, "SHUTDOWN_TIMEOUT", cm.Data["SHUTDOWN_TIMEOUT"])
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds = %v, want above SHUTDOWN_TIMEOUT=%s", ptrString(g), shutdown)
	}

	ps := pod.Spec.SecurityContext
	if ps == nil || !isTrue(ps.RunAsNonRoot) || intIs(ps.RunAsUser, 65532) == false || intIs(ps.RunAsGroup, 65532) == false ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot, 65532:65532, seccomp RuntimeDefault", ps)
	}
	if isTrue(pod.Spec.AutomountServiceAccountToken) {
		t.Error("pod automounts a ServiceAccount token; the proxy never calls the API server")
	}

	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || !isTrue(sc.ReadOnlyRootFilesystem) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || !isTrue(sc.RunAsNonRoot) {
		t.Errorf("container securityContext = %+v, want readOnlyRootFilesystem, no privilege escalation, drop ALL, runAsNonRoot", sc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want cpu and memory requests and a memory limit", c.Resources)
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if want := portOf(t, cm.Data["LISTEN_ADDR"]); ports["http"] != want {
		t.Errorf("container port http = %d, want %d (LISTEN_ADDR)", ports["http"], want)
	}
	if want := portOf(t, cm.Data["ADMIN_ADDR"]); ports["admin"] != want {
		t.Errorf("container port admin = %d, want %d (ADMIN_ADDR)", ports["admin"], want)
	}
	checkProbe(t, "liveness", c.LivenessProbe, "/healthz")
	checkProbe(t, "readiness", c.ReadinessProbe, "")
	if p := c.ReadinessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path != "/readyz" && cm.Data["FAIL_MODE"] != "open" {
		t.Errorf("readiness path %q with FAIL_MODE=%s, want /readyz", p.HTTPGet.Path, cm.Data["FAIL_MODE"])
	}

	var envFromCM bool
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil && ef.ConfigMapRef.Name == cm.Name {
			envFromCM = true
		}
	}
	if !envFromCM {
		t.Errorf("container envFrom does not reference ConfigMap %s", cm.Name)
	}
	for _, e := range c.Env {
		if slices.Contains(secretVars, e.Name) && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("env %s is not read from a Secret (valueFrom.secretKeyRef)", e.Name)
		}
	}

	var spread bool
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		if tsc.TopologyKey != "kubernetes.io/hostname" {
			continue
		}
		spread = tsc.WhenUnsatisfiable == corev1.ScheduleAnyway
		s, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("topology spread labelSelector %v does not select the pods", tsc.LabelSelector)
		}
	}
	if !spread {
		t.Errorf("no topologySpreadConstraint on kubernetes.io/hostname with ScheduleAnyway: %+v", pod.Spec.TopologySpreadConstraints)
	}
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, path string) {
	t.Helper()
	switch {
	case p == nil || p.HTTPGet == nil:
		t.Errorf("%s probe = %+v, want httpGet", what, p)
	case p.HTTPGet.Port.StrVal != "admin":
		t.Errorf("%s probe port = %v, want admin", what, p.HTTPGet.Port.String())
	case path != "" && p.HTTPGet.Path != path:
		t.Errorf("%s probe path = %q, want %q", what, p.HTTPGet.Path, path)
	case p.PeriodSeconds == 0 || p.TimeoutSeconds == 0 || p.FailureThreshold == 0 || p.SuccessThreshold == 0:
		t.Errorf("%s probe %+v: want explicit period, timeout and thresholds", what, p)
	}
}

func checkService(t *testing.T, m *manifests) {
	t.Helper()
	if len(m.services) != 1 {
		t.Fatalf("%d Services, want 1", len(m.services))
	}
	svc := m.services[0]
	pod := m.deployment.Spec.Template
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	got := map[string]string{}
	for _, p := range svc.Spec.Ports {
		got[p.Name] = p.TargetPort.String()
	}
	if got["http"] != "http" || got["admin"] != "admin" || len(got) != 2 {
		t.Errorf("Service ports (name -> targetPort) = %v, want http->http and admin->admin", got)
	}
}

// checkRefs checks that names referenced across objects exist in the render.
func checkRefs(t *testing.T, m *manifests) {
	t.Helper()
	d := m.deployment
	pod := d.Spec.Template
	if sa := pod.Spec.ServiceAccountName; sa != "" && sa != "default" {
		if _, ok := m.all["ServiceAccount/"+sa]; !ok {
			t.Errorf("pod uses ServiceAccount %s, which is not rendered", sa)
		}
	}
	for _, e := range pod.Spec.Containers[0].Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if s := m.secret(ref.Name); s != nil {
			if _, ok := s.Data[ref.Key]; !ok && !isTrue(ref.Optional) {
				t.Errorf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
		}
	}
	for _, h := range m.hpas {
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != d.Name {
			t.Errorf("HPA targets %v, want Deployment %s", h.Spec.ScaleTargetRef, d.Name)
		}
		if d.Spec.Replicas != nil {
			t.Errorf("Deployment sets replicas=%d while an HPA manages it", *d.Spec.Replicas)
		}
	}
	for _, p := range m.pdbs {
		s, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("PDB selector %v does not select the pods", p.Spec.Selector)
		}
	}
	for _, sm := range m.serviceMonitors {
		s, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || s.Empty() || !s.Matches(labels.Set(m.services[0].Labels)) {
			t.Errorf("ServiceMonitor selector %v does not select Service %s", sm.Spec.Selector, m.services[0].Name)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor endpoints = %+v, want port admin, path /metrics", sm.Spec.Endpoints)
		}
	}
	for _, ing := range m.ingresses {
		for _, r := range ing.Spec.Rules {
			for _, p := range r.HTTP.Paths {
				if b := p.Backend.Service; b == nil || b.Name != m.services[0].Name || b.Port.Name != "http" {
					t.Errorf("Ingress backend %+v, want Service %s port http", p.Backend, m.services[0].Name)
				}
			}
		}
	}
	for _, cm := range m.configMaps {
		raw, ok := cm.Data["idemproxy.json"]
		if !ok {
			continue
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard ConfigMap %s labels %v, want grafana_dashboard: \"1\"", cm.Name, cm.Labels)
		}
		var dash struct {
			UID    string `json:"uid"`
			Panels []struct {
				Title string `json:"title"`
			} `json:"panels"`
		}
		if err := json.Unmarshal([]byte(raw), &dash); err != nil {
			t.Errorf("dashboard JSON: %v", err)
		}
		for _, metric := range dashboardMetrics {
			if !strings.Contains(raw, metric) {
				t.Errorf("dashboard does not query %s", metric)
			}
		}
		for _, title := range []string{"Replay ratio", "409 / 422 rate", "Redis script latency", "Upstream latency by route", "Takeovers"} {
			if !slices.ContainsFunc(dash.Panels, func(p struct {
				Title string `json:"title"`
			}) bool {
				return p.Title == title
			}) {
				t.Errorf("dashboard has no panel %q", title)
			}
		}
	}
}

func checkTestPod(t *testing.T, m *manifests) {
	t.Helper()
	if len(m.pods) != 1 {
		t.Fatalf("%d Pods, want the helm test pod", len(m.pods))
	}
	p := m.pods[0]
	if p.Annotations["helm.sh/hook"] != "test" {
		t.Errorf("test pod hook annotation = %q, want test", p.Annotations["helm.sh/hook"])
	}
	cmd := strings.Join(append(p.Spec.Containers[0].Command, p.Spec.Containers[0].Args...), " ")
	want := fmt.Sprintf("http://%s:%d/readyz", m.services[0].Name, servicePort(m.services[0], "admin"))
	if !strings.Contains(cmd, want) {
		t.Errorf("test pod runs %q, want a call to %s", cmd, want)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("test pod restartPolicy = %q, want Never", p.Spec.RestartPolicy)
	}
}

// TestPodDisruptionBudget checks the PDB renders only when at least two replicas run.
func TestPodDisruptionBudget(t *testing.T) {
	withRedis := []string{"--set", "redis.existingSecret=redis"}
	tests := []struct {
		name    string
		args    []string
		wantPDB bool
	}{
		{"default single replica", nil, false},
		{"replicaCount 1 with external Redis", withRedis, false},
		{"replicaCount 2", append(withRedis, "--set", "replicaCount=2"), true},
		{"HPA minReplicas 1", append(withRedis, "--set", "autoscaling.enabled=true,autoscaling.minReplicas=1,replicaCount=3"), false},
		{"HPA minReplicas 2", append(withRedis, "--set", "autoscaling.enabled=true,autoscaling.minReplicas=2"), true},
		{"minReplicas ignored without HPA", append(withRedis, "--set", "autoscaling.minReplicas=5"), false},
		{"disabled", append(withRedis, "--set", "replicaCount=3,podDisruptionBudget.enabled=false"), false},
		{"replicated-values.yaml", []string{"-f", chartDir + "/ci/replicated-values.yaml"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := mustRender(t, tt.args...)
			if got := len(m.pdbs) == 1; got != tt.wantPDB {
				t.Errorf("PDB rendered: got %v, want %v", got, tt.wantPDB)
			}
		})
	}
}

// TestReplicatedValues checks the production-like CI values turn on what they claim to.
func TestReplicatedValues(t *testing.T) {
	m := mustRender(t, "-f", chartDir+"/ci/replicated-values.yaml")
	if len(m.hpas) != 1 || m.hpas[0].Spec.MinReplicas == nil || *m.hpas[0].Spec.MinReplicas != 3 {
		t.Errorf("HPA = %+v, want one with minReplicas 3", m.hpas)
	}
	if len(m.serviceMonitors) != 1 {
		t.Errorf("%d ServiceMonitors, want 1", len(m.serviceMonitors))
	}
	if m.configMap(m.deployment.Name+"-dashboard") == nil {
		t.Error("no dashboard ConfigMap")
	}
	if len(m.secrets) != 0 {
		t.Errorf("chart rendered %d Secrets although redis.existingSecret is set", len(m.secrets))
	}
	env := envByName(m.deployment)
	if ref := env["REDIS_URL"].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "idemproxy-redis" || ref.SecretKeyRef.Key != "url" {
		t.Errorf("REDIS_URL = %+v, want secretKeyRef idemproxy-redis/url", env["REDIS_URL"])
	}
}

// TestSentinelValues checks sentinel mode: seeds in the ConfigMap, password from the Secret.
func TestSentinelValues(t *testing.T) {
	m := mustRender(t, "-f", chartDir+"/ci/sentinel-values.yaml")
	cm := m.configMap(m.deployment.Name)
	if cm.Data["REDIS_MODE"] != "sentinel" || cm.Data["REDIS_MASTER_NAME"] != "orders-master" ||
		len(strings.Split(cm.Data["REDIS_ADDRS"], ",")) != 3 {
		t.Errorf("ConfigMap REDIS_* = %q %q %q", cm.Data["REDIS_MODE"], cm.Data["REDIS_MASTER_NAME"], cm.Data["REDIS_ADDRS"])
	}
	env := envByName(m.deployment)
	if _, ok := env["REDIS_URL"]; ok {
		t.Error("REDIS_URL set in sentinel mode")
	}
	if ref := env["REDIS_PASSWORD"].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "redis-sentinel-auth" || isTrue(ref.SecretKeyRef.Optional) {
		t.Errorf("REDIS_PASSWORD = %+v, want a required secretKeyRef to redis-sentinel-auth", env["REDIS_PASSWORD"])
	}
	// The sentinels' own credentials: from the same Secret, optional there
	// (sentinels without requirepass need none).
	for _, v := range []string{"REDIS_SENTINEL_USERNAME", "REDIS_SENTINEL_PASSWORD"} {
		if ref := env[v].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "redis-sentinel-auth" || !isTrue(ref.SecretKeyRef.Optional) {
			t.Errorf("%s = %+v, want an optional secretKeyRef to redis-sentinel-auth", v, env[v])
		}
	}
}

// TestInlineSentinelPassword: an inline sentinel password goes to the chart's
// Secret and reaches the pod as a required secretKeyRef.
func TestInlineSentinelPassword(t *testing.T) {
	m := mustRender(t, "--set", "config.redisMode=sentinel", "--set", "config.redisAddrs[0]=s0:26379",
		"--set", "redis.password=datapw", "--set", "redis.sentinelPassword=sentpw")
	if len(m.secrets) != 1 || string(m.secrets[0].Data["redis-sentinel-password"]) != "sentpw" {
		t.Fatalf("Secrets = %+v, want one holding redis-sentinel-password", m.secrets)
	}
	env := envByName(m.deployment)
	ref := env["REDIS_SENTINEL_PASSWORD"].ValueFrom
	if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != m.secrets[0].Name || isTrue(ref.SecretKeyRef.Optional) {
		t.Errorf("REDIS_SENTINEL_PASSWORD valueFrom = %+v, want a required ref to the chart's Secret", ref)
	}
	if _, ok := env["REDIS_SENTINEL_USERNAME"]; ok {
		t.Errorf("REDIS_SENTINEL_USERNAME set though no sentinel username was given")
	}
}

// TestInlineRedisURL checks an inline URL goes to a chart-made Secret, never the ConfigMap.
func TestInlineRedisURL(t *testing.T) {
	const url = "redis://:pw@redis:6379/0"
	m := mustRender(t, "--set", "redis.url="+url, "--set", "replicaCount=2")
	if len(m.secrets) != 1 || string(m.secrets[0].Data["redis-url"]) != url {
		t.Fatalf("Secrets = %+v, want one holding redis-url", m.secrets)
	}
	ref := envByName(m.deployment)["REDIS_URL"].ValueFrom
	if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != m.secrets[0].Name {
		t.Errorf("REDIS_URL valueFrom = %+v, want the chart's Secret %s", ref, m.secrets[0].Name)
	}
	if m.deployment.Spec.Template.Annotations["checksum/secret"] == "" {
		t.Error("no checksum/secret annotation")
	}
}

// TestTerminationGrace checks the derived and the explicit grace period.
func TestTerminationGrace(t *testing.T) {
	tests := []struct {
		args []string
		want int64
	}{
		{nil, 75},
		{[]string{"--set", "config.shutdownTimeout=1m30s"}, 105},
		{[]string{"--set", "config.upstreamTimeout=1s,config.requestReadTimeout=1s,config.shutdownTimeout=18500ms"}, 34},
		{[]string{"--set", "terminationGracePeriodSeconds=61"}, 61},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			m := mustRender(t, tt.args...)
			if got := m.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds; got == nil || *got != tt.want {
				t.Errorf("terminationGracePeriodSeconds = %s, want %d", ptrString(got), tt.want)
			}
		})
	}
}

// TestRenderFails checks the render refuses unsafe or invalid values with a clear message.
func TestRenderFails(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"embedded Redis with 3 replicas", []string{"--set", "replicaCount=3"}, "embedded Redis with replicaCount=3"},
		{"embedded Redis with autoscaling", []string{"--set", "autoscaling.enabled=true"}, "embedded Redis with autoscaling.enabled=true"},
		{"grace not above shutdown", []string{"--set", "terminationGracePeriodSeconds=45"}, "must be above config.shutdownTimeout"},
		{"shutdown cannot cover upstream and recording", []string{"--set", "config.shutdownTimeout=30s"}, "must be at least config.requestReadTimeout (REQUEST_READ_TIMEOUT=10s) + config.upstreamTimeout (UPSTREAM_TIMEOUT=30s) + 16s"},
		{"upgrade with options", []string{"--set", "config.routes[0].method=GET,config.routes[0].pattern=/ws,config.routes[0].upgrade=true,config.routes[0].required=true"}, "off means plain pass-through"},
		{"upstream timeout not below lock TTL", []string{"--set", "config.upstreamTimeout=60s"}, "must be below config.lockTTL"},
		{"route lock below upstream timeout", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].lock=10s"}, "must be above config.upstreamTimeout"},
		{"off with options", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].off=true,config.routes[0].ttl=1h"}, "off means plain pass-through"},
		{"duplicate route", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[1].method=post,config.routes[1].pattern=/a"}, "is already defined"},
		{"verify without a signing key", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=sns,config.routes[0].verify.secretName=s,config.routes[0].verify.keys[0]=k"}, "verify checks the signature of github"},
		{"verify without keys", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=github,config.routes[0].verify.secretName=s"}, "verify"},
		{"bad record4xx", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].record4xx=some"}, "/config/routes/0/record4xx"},
		{"sentinel without addrs", []string{"--set", "config.redisMode=sentinel"}, "config.redisAddrs (REDIS_ADDRS) is required"},
		{"admin listener off", []string{"--set", "config.adminAddr="}, "adminAddr"},
		{"bad duration", []string{"--set", "config.ttl=tomorrow"}, "/config/ttl"},
		{"unknown top-level key", []string{"--set", "replicas=3"}, "additional properties 'replicas' not allowed"},
		{"unknown config key", []string{"--set", "config.lockTtl=60s"}, "additional properties 'lockTtl' not allowed"},
		{"wrong type", []string{"--set-string", "replicaCount=three"}, "/replicaCount"},
		{"bad REDIS_MODE", []string{"--set", "config.redisMode=single"}, "/config/redisMode"},
		{"bad FAIL_MODE", []string{"--set", "config.failMode=maybe"}, "/config/failMode"},
		{"bad ON_5XX", []string{"--set", "config.on5xx=retry"}, "/config/on5xx"},
		{"bad LOG_FORMAT", []string{"--set", "config.logFormat=text"}, "/config/logFormat"},
		{"bad route fail", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].fail=half"}, "/config/routes/0/fail"},
		{"bad route on5xx", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].on5xx=keep"}, "/config/routes/0/on5xx"},
		{"unknown route option", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].tll=1h"}, "additional properties 'tll' not allowed"},
		{"no upstream", []string{"--set", "config.upstreamURL="}, "upstreamURL"},
		{"sentinel password outside sentinel mode", []string{"--set", "redis.url=redis://r:6379/0", "--set", "redis.sentinelPassword=x"}, "only used with config.redisMode=sentinel"},
		{"request read timeout zero", []string{"--set", "config.requestReadTimeout=0s"}, "config.requestReadTimeout=0s must be above zero"},
		{"upstream id not ASCII", []string{"--set", "config.upstreamID=café"}, "/config/upstreamID"},
		{"body bound", []string{"--set", "config.maxBodyBytes=67108865"}, "/config/maxBodyBytes"},
		{"stored bound", []string{"--set", "config.maxStoredResponseBytes=67108865"}, "/config/maxStoredResponseBytes"},
		{"buffered zero", []string{"--set", "config.maxBufferedBytes=0"}, "/config/maxBufferedBytes"},
		// --set passes 0.09 as a string (the pattern), --set-json as a number (the range).
		{"memory ratio below one half", []string{"--set", "config.goMemLimitRatio=0.09"}, "/config/goMemLimitRatio"},
		{"memory ratio below one half, a number", []string{"--set-json", "config.goMemLimitRatio=0.09"}, "minimum: got 0.09, want 0.5"},
		{"memory ratio above one", []string{"--set", "config.goMemLimitRatio=90"}, "maximum: got 90, want 1"},
		{"memory ratio not a number", []string{"--set-string", "config.goMemLimitRatio=90%"}, "/config/goMemLimitRatio"},
		{"buffered below one request", []string{"--set", "config.maxBodyBytes=33554432"}, "config.maxBufferedBytes (MAX_BUFFERED_BYTES=33554432) must hold one keyed request's body and answer, at least config.maxBodyBytes (MAX_BODY_BYTES=33554432) + config.maxStoredResponseBytes (MAX_STORED_RESPONSE_BYTES=1048576) + 16384 = 34619392"},
		{"bad FINGERPRINT", []string{"--set", "config.fingerprint=loose"}, "/config/fingerprint"},
		{"bad route fingerprint", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].fingerprint=bytes"}, "/config/routes/0/fingerprint"},
		{"route key with a space", []string{"--set-string", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=header:X-A header:X-B"}, "/config/routes/0/key"},
		{"route key with a semicolon", []string{"--set-string", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=github;POST"}, "/config/routes/0/key"},
		{"route key unknown part", []string{"--set-string", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=cookie:sid"}, `key "cookie:sid": part "cookie:sid" must be header:NAME, query:NAME or json:/POINTER`},
		{"route key preset in a composite", []string{"--set-string", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=github+header:X-A"}, `part "github" must be`},
		{"route key pointer without slash", []string{"--set-string", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].key=json:id"}, `part "json:id" must be`},
		{"route scope not a header", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].scope[0]=X A"}, "/config/routes/0/scope/0"},
		{"off with key", []string{"--set", "config.routes[0].method=POST,config.routes[0].pattern=/a,config.routes[0].off=true,config.routes[0].key=github"}, "so key would be ignored"},
		{"off with empty scope", []string{"-f", "testdata/off-scope-values.yaml"}, "so scope would be ignored"},
		{"upgrade with fingerprint", []string{"--set", "config.routes[0].method=GET,config.routes[0].pattern=/ws,config.routes[0].upgrade=true,config.routes[0].fingerprint=none"}, "so fingerprint would be ignored"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, tt.args...)
			if err == nil {
				t.Fatalf("render succeeded, want an error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestRoutesString checks the ROUTES string rendered from ci/routes-values.yaml, option order
// included (the proxy's parser is exercised in routes_parse_test.go).
func TestRoutesString(t *testing.T) {
	m := mustRender(t, "-f", chartDir+"/ci/routes-values.yaml")
	got := m.configMap(m.deployment.Name).Data["ROUTES"]
	want := "POST /v1/payments/* ttl=48h lock=2m required unknown=hold;" +
		"POST /v1/orders ttl=1h wait=10s on5xx=store;" +
		"PATCH /v1/orders/{id} ttl=30m lock=45s fail=open;" +
		"POST /v1/refunds/* fail=closed wait=1.5s on5xx=release observe;" +
		"DELETE /v1/refunds/{id} unknown=expire enforce;" +
		"POST /v1/webhooks/* off;" +
		"PUT /v1/health-checks off;" +
		"GET /v1/events/ws upgrade"
	if got != want {
		t.Errorf("ROUTES = %q, want %q", got, want)
	}
}

// TestWebhookRoutesString checks the ROUTES string rendered from ci/webhooks-values.yaml: key=,
// scope= (an empty list renders "scope=", no scope) and fingerprint=, after the other options.
func TestWebhookRoutesString(t *testing.T) {
	m := mustRender(t, "-f", chartDir+"/ci/webhooks-values.yaml")
	data := m.configMap(m.deployment.Name).Data
	want := "POST /hooks/github ttl=72h key=github scope= verify=IDEMPROXY_VERIFY_0_0,IDEMPROXY_VERIFY_0_1;" +
		"POST /hooks/standard ttl=48h key=standard-webhooks scope=;" +
		"POST /hooks/stripe ttl=72h key=stripe-events scope= fingerprint=none verify=IDEMPROXY_VERIFY_2_0 record4xx=all;" +
		"POST /hooks/shopify ttl=48h key=shopify scope=X-Shopify-Shop-Domain fingerprint=none;" +
		"POST /hooks/sns key=sns scope=x-amz-sns-topic-arn fingerprint=strict;" +
		"POST /hooks/events key=cloudevents scope= fingerprint=none;" +
		"POST /hooks/partners/* required key=header:X-Partner-Id+json:/event/id|query:event_id scope=X-Partner-Id,X-Partner-Env;" +
		"POST /v1/orders scope="
	if got := data["ROUTES"]; got != want {
		t.Errorf("ROUTES = %q, want %q", got, want)
	}
	if got := data["FINGERPRINT"]; got != "json" {
		t.Errorf("FINGERPRINT = %q, want %q", got, "json")
	}
	if got := mustRender(t).configMap(m.deployment.Name).Data["FINGERPRINT"]; got != "strict" {
		t.Errorf("default FINGERPRINT = %q, want %q", got, "strict")
	}
	// The signing secrets reach the pod from their Secrets, never through
	// the ConfigMap.
	env := envByName(m.deployment)
	for name, ref := range map[string][2]string{
		"IDEMPROXY_VERIFY_0_0": {"github-webhook", "secret"},
		"IDEMPROXY_VERIFY_0_1": {"github-webhook", "secret-previous"},
		"IDEMPROXY_VERIFY_2_0": {"stripe-webhook", "signing-secret"},
	} {
		e, ok := env[name]
		if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
			t.Errorf("%s: %+v, want it from a Secret", name, e)
			continue
		}
		if sk := e.ValueFrom.SecretKeyRef; sk.Name != ref[0] || sk.Key != ref[1] || isTrue(sk.Optional) {
			t.Errorf("%s from Secret %s key %s (optional %v), want %s key %s, not optional", name, sk.Name, sk.Key, isTrue(sk.Optional), ref[0], ref[1])
		}
	}
	if got := data["SIGNATURE_TOLERANCE"]; got != "5m" {
		t.Errorf("SIGNATURE_TOLERANCE = %q, want the default 5m", got)
	}
}

func envByName(d *appsv1.Deployment) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		out[e.Name] = e
	}
	return out
}

func servicePort(svc *corev1.Service, name string) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p.Port
		}
	}
	return 0
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	var p int32
	if _, err := fmt.Sscan(addr[i+1:], &p); i < 0 || err != nil {
		t.Fatalf("listen address %q has no port", addr)
	}
	return p
}

func isTrue(b *bool) bool { return b != nil && *b }

func intIs(p *int64, v int64) bool { return p != nil && *p == v }

func ptrString(p *int64) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprint(*p)
}

// TestGoMemLimitRatioValues: helm --set passes a ratio such as 0.8 as a
// string; the chart takes it as it takes a number (the schema used to take
// numbers only, so only 0 and 1 got through --set).
func TestGoMemLimitRatioValues(t *testing.T) {
	for _, tc := range []struct{ args []string }{
		{[]string{"--set", "config.goMemLimitRatio=0.8"}},
		{[]string{"--set", "config.goMemLimitRatio=0.5"}},
		{[]string{"--set", "config.goMemLimitRatio=0.95"}},
		{[]string{"--set", "config.goMemLimitRatio=1"}},
		{[]string{"--set", "config.goMemLimitRatio=0"}},
		{[]string{"--set-json", "config.goMemLimitRatio=0.8"}},
	} {
		want := tc.args[1][len("config.goMemLimitRatio="):]
		out, err := render(t, tc.args...)
		if err != nil {
			t.Errorf("%v (a valid ratio) refused: %v", tc.args, err)
			continue
		}
		m := decodeAll(t, out)
		if got := m.configMap(m.deployment.Name).Data["GOMEMLIMIT_RATIO"]; got != want {
			t.Errorf("%v: GOMEMLIMIT_RATIO = %q, want %q", tc.args, got, want)
		}
	}
}
