package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestSentinelPassword: sentinels that require a password. With
// REDIS_SENTINEL_PASSWORD the proxy finds the master through them and
// replays; without it, /readyz is 503 and keyed requests fail closed. The
// seeds are given with blanks after the commas (REDIS_ADDRS is trimmed).
func TestSentinelPassword(t *testing.T) {
	const pw = "sentinel-s3cret"
	s := redistest.StartSentinelWith(t, redistest.SentinelOptions{Password: pw})
	up := newUpstream(t)
	base := []string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0",
		"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ", "), "REDIS_MASTER_NAME=" + s.MasterName()}
	c := newClient(t)

	a, logs := startEnv(t, append(base, "REDIS_SENTINEL_PASSWORD="+pw)...)
	waitStatus(t, c, "http://"+a.adminAddr.String()+"/readyz", http.StatusOK, 10*time.Second)
	u := "http://" + a.proxyAddr.String() + "/v1/orders"
	first := mustPost(t, c, u, "sent-1", `{"n":1}`)
	second := mustPost(t, c, u, "sent-1", `{"n":1}`)
	if first.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" || second.body != first.body {
		t.Errorf("with the sentinel password: got %v then %v replayed=%q, want 201 then its replay", first.status, second.status, second.header.Get("Idempotent-Replayed"))
	}
	if got := up.Calls.Load(); got != 1 {
		t.Errorf("upstream calls: got %v, want 1", got)
	}
	if strings.Contains(logs.String(), pw) {
		t.Errorf("log shows the sentinel password")
	}

	b, _ := startEnv(t, base...)
	status, body, err := get(c, "http://"+b.adminAddr.String()+"/readyz")
	if err != nil || status != http.StatusServiceUnavailable {
		t.Errorf("/readyz without the sentinel password: got %v %v %q, want 503", status, err, body)
	}
	if r := mustPost(t, c, "http://"+b.proxyAddr.String()+"/v1/orders", "sent-2", `{"n":2}`); r.status != http.StatusServiceUnavailable {
		t.Errorf("POST without the sentinel password: got %v %q, want 503", r.status, r.body)
	}
	if got := up.Calls.Load(); got != 1 {
		t.Errorf("upstream calls: got %v, want 1", got)
	}
}

// TestSentinelCredentialsOnlyInSentinelMode: elsewhere they are refused,
// by name, and the password is never shown.
func TestSentinelCredentialsOnlyInSentinelMode(t *testing.T) {
	const up, pw = "UPSTREAM_URL=http://127.0.0.1:9", "s3cretPW"
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"password in standalone", []string{up, "REDIS_SENTINEL_PASSWORD=" + pw}, "REDIS_SENTINEL_PASSWORD"},
		{"username in cluster", []string{up, "REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:7000", "REDIS_SENTINEL_USERNAME=u"}, "REDIS_SENTINEL_USERNAME"},
		{"password in cluster", []string{up, "REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:7000", "REDIS_SENTINEL_PASSWORD=" + pw}, "REDIS_SENTINEL_PASSWORD"},
		{"username without password", []string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:26379", "REDIS_SENTINEL_USERNAME=u"}, "REDIS_SENTINEL_PASSWORD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming %s", err, tt.want)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
	cfg, err := loadConfig([]string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:26379", "REDIS_SENTINEL_USERNAME=u", "REDIS_SENTINEL_PASSWORD=" + pw})
	if err != nil || cfg.RedisSentinelUsername != "u" || cfg.RedisSentinelPassword != pw {
		t.Errorf("sentinel mode with both: %v, want them accepted", err)
	}
}
