package main

import (
	"strings"
	"testing"
)

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
