package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKeysRunsWithoutTheWebhookSecrets: idemproxy keys reads the proxies'
// environment for Redis and KEY_PREFIX (UPSTREAM_URL is not needed, the
// contract says). An operator who runs it from a workstation or a bastion
// with the proxies' ConfigMap (ROUTES included) has no business holding the
// senders' signing secrets, and the command uses none of them: it must not
// refuse to list or purge keys because a verify= variable is unset there,
// which would push operators to copy webhook secrets onto every machine
// they inspect Redis from.
func TestKeysRunsWithoutTheWebhookSecrets(t *testing.T) {
	srv := redistest.Start(t)
	environ := []string{
		"REDIS_URL=" + srv.URL(),
		"ROUTES=POST /hooks/github key=github scope= verify=GITHUB_WEBHOOK_SECRET",
	}
	var stdout, stderr bytes.Buffer
	if err := runKeys(context.Background(), []string{"list"}, environ, &stdout, &stderr); err != nil {
		t.Errorf("keys list with the proxies' ROUTES but without the webhook secret: %v\nstderr: %s", err, stderr.String())
	}
}
