package main

import (
	"os"
	"strings"
	"testing"
)

// TestWebhookDocsSignedDeliveriesConsistent: the webhook page once said
// in one part that idemproxy checks no signature and that an upstream's 401
// to a forgery is recorded and replayed to the genuine delivery, the
// opposite of what verify= and the release of 401/403 on key= routes do;
// and it told Helm users to pass the secrets through envFrom or extraEnv,
// while the chart takes them as config.routes[].verify.secretName and keys
// (and renders variable names of its own, so a secret under extraEnv cannot
// be named by a chart route). An operator deciding whether the upstream
// must keep its own checks reads both.
func TestWebhookDocsSignedDeliveriesConsistent(t *testing.T) {
	b, err := os.ReadFile("docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, stale := range []string{
		"Signatures are not checked by idemproxy",
		"your API's refusal (401) is recorded and the real delivery gets it",
	} {
		if strings.Contains(readme, stale) {
			t.Errorf("docs/webhooks.md still says %q", stale)
		}
	}
	if !strings.Contains(readme, "secretName") {
		t.Error("docs/webhooks.md does not document the chart's config.routes[].verify.secretName/keys")
	}
}
