package validate

import (
	"net/url"
	"strings"
	"testing"
)

// otelEnv returns the Deployment's OTEL_* variables: the literal values, and
// for valueFrom "secret:NAME/KEY" or "field:PATH".
func otelEnv(t *testing.T, args ...string) map[string]string {
	t.Helper()
	m := mustRender(t, args...)
	out := map[string]string{}
	for name, e := range envByName(m.deployment) {
		if !strings.HasPrefix(name, "OTEL_") {
			continue
		}
		switch {
		case e.ValueFrom == nil:
			out[name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			if isTrue(e.ValueFrom.SecretKeyRef.Optional) {
				t.Errorf("%s: optional secretKeyRef, want a required one", name)
			}
			out[name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil:
			out[name] = "field:" + e.ValueFrom.FieldRef.FieldPath
		}
	}
	return out
}

// TestTracingOffByDefault: no OTEL_* variable at all, so the proxy does no
// tracing work.
func TestTracingOffByDefault(t *testing.T) {
	if env := otelEnv(t); len(env) != 0 {
		t.Errorf("OTEL_* env by default: got %v, want none", env)
	}
}

// TestTracingValues checks ci/tracing-values.yaml renders every tracing value
// as its standard OTEL_* variable.
func TestTracingValues(t *testing.T) {
	got := otelEnv(t, "-f", chartDir+"/ci/tracing-values.yaml")
	want := map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4317",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":     "0.25",
		"OTEL_SERVICE_NAME":           "payments-idemproxy",
		"OTEL_RESOURCE_ATTRIBUTES":    "k8s.namespace.name=$(OTEL_K8S_NAMESPACE),k8s.pod.name=$(OTEL_K8S_POD_NAME),deployment.environment.name=prod,service.namespace=payments",
		"OTEL_EXPORTER_OTLP_HEADERS":  "secret:otlp-auth/headers",
		"OTEL_K8S_NAMESPACE":          "field:metadata.namespace",
		"OTEL_K8S_POD_NAME":           "field:metadata.name",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s=%q", k, got[k])
		}
	}
}

// TestTracingMinimal: enabled with an endpoint only gets the defaults, and no
// headers, sampler argument or service name.
func TestTracingMinimal(t *testing.T) {
	got := otelEnv(t, "--set", "tracing.enabled=true", "--set", "tracing.endpoint=http://collector:4318", "--set", "tracing.samplerArg=0.5")
	if got["OTEL_EXPORTER_OTLP_PROTOCOL"] != "http/protobuf" || got["OTEL_TRACES_SAMPLER"] != "parentbased_always_on" || got["OTEL_TRACES_SAMPLER_ARG"] != "0.5" {
		t.Errorf("defaults: got %v", got)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_SERVICE_NAME"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s set (%q); want it left to the proxy's default", k, got[k])
		}
	}
}

func TestTracingRenderFails(t *testing.T) {
	on := []string{"--set", "tracing.enabled=true", "--set", "tracing.endpoint=http://c:4318"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"enabled without endpoint", []string{"--set", "tracing.enabled=true"}, "tracing.endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) is required"},
		{"endpoint not a URL", []string{"--set", "tracing.enabled=true", "--set", "tracing.endpoint=collector:4318"}, "/tracing/endpoint"},
		{"bad protocol", append(on, "--set", "tracing.protocol=http/json"), "/tracing/protocol"},
		{"bad sampler", append(on, "--set", "tracing.sampler=sometimes"), "/tracing/sampler"},
		{"ratio above 1", append(on, "--set-string", "tracing.samplerArg=2"), "/tracing/samplerArg"},
		{"attribute with a comma", append(on, "--set-string", "tracing.resourceAttributes.team=a\\,b"), "/tracing/resourceAttributes"},
		{"unknown key", append(on, "--set", "tracing.ratio=0.1"), "additional properties 'ratio' not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("render: got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestResourceAttributePercentEncoded: the schema lets a resource attribute
// value hold "%" (it only forbids "," and "="), and the chart renders it raw
// into OTEL_RESOURCE_ATTRIBUTES, whose values are percent-encoded (W3C
// Baggage). Rendered raw, the proxy's checkTracing refused to start ("value of "sla"
// is not percent-encoded correctly"): an install that helm accepted crash-looped.
// The chart percent-encodes the values, or the schema refuses "%".
func TestResourceAttributePercentEncoded(t *testing.T) {
	args := []string{"--set", "tracing.enabled=true", "--set", "tracing.endpoint=http://c:4318",
		"--set-string", "tracing.resourceAttributes.sla=99.9%", "--set-string", "tracing.resourceAttributes.owner=team 50%25"}
	if _, err := render(t, args...); err != nil {
		return // refused by the schema: fine
	}
	got := otelEnv(t, args...)["OTEL_RESOURCE_ATTRIBUTES"]
	want := map[string]string{"sla": "99.9%", "owner": "team 50%25"}
	for p := range strings.SplitSeq(got, ",") {
		k, v, _ := strings.Cut(p, "=")
		w, ok := want[k]
		if !ok {
			continue
		}
		dec, err := url.PathUnescape(v)
		if err != nil || dec != w {
			t.Errorf("OTEL_RESOURCE_ATTRIBUTES=%q: %s's value %q decodes to %q (%v); want %q, or the schema to refuse it", got, k, v, dec, err, w)
		}
	}
}
