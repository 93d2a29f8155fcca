package main

import (
	"strings"
	"testing"
)

// OTEL_EXPORTER_OTLP_HEADERS holds the collector's credentials (the chart
// reads it from a Secret). A malformed value, such as the common
// "Authorization: Bearer ..." (a colon, not "="), or a bad percent escape,
// stops the proxy with a message that quotes the whole value, so the token
// lands in the pod's logs. The rest of the configuration redacts credentials
// (redactURL for REDIS_URL, UPSTREAM_URL, DOCS_URL); so should this, and an
// endpoint URL with user info.
func TestReview13OTELRefusalsDoNotLeakCredentials(t *testing.T) {
	const secret = "sk_live_review13_SECRET"
	tests := []struct {
		name string
		env  []string
		want string // the variable the refusal must still name
	}{
		{"headers with a colon", []string{envEndpoint + "=http://c:4318", envHeaders + "=Authorization: Bearer " + secret}, envHeaders},
		{"headers bad escape", []string{envEndpoint + "=http://c:4318", envHeaders + "=authorization=Bearer%zz" + secret}, envHeaders},
		{"traces headers", []string{envEndpoint + "=http://c:4318", envTracesHeaders + "=x-api-key " + secret}, envTracesHeaders},
		{"endpoint with user info", []string{envEndpoint + "=grpcs://otel:" + secret + "@collector:4317"}, envEndpoint},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(append([]string{"UPSTREAM_URL=http://127.0.0.1:1"}, tt.env...))
			if err == nil {
				t.Fatalf("loadConfig(%q): accepted; want a refusal", tt.env)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("refusal does not name %s: %v", tt.want, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("refusal quotes the credential: %v", err)
			}
		})
	}
}
