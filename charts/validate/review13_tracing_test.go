package validate

import (
	"net/url"
	"strings"
	"testing"
)

// TestReview13ResourceAttributePercent: the schema lets a resource attribute
// value hold "%" (it only forbids "," and "="), and the chart renders it raw
// into OTEL_RESOURCE_ATTRIBUTES, whose values are percent-encoded (W3C
// Baggage). The proxy's checkTracing then refuses to start ("value of "sla"
// is not percent-encoded correctly"): an install that helm accepted crash-loops.
// The chart should percent-encode the values, or the schema refuse "%".
func TestReview13ResourceAttributePercent(t *testing.T) {
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
