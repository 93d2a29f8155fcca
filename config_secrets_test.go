package main

import (
	"strings"
	"testing"
)

// TestRedisURLConnectionStringPasswordNotShown: the contract says a
// password in REDIS_URL is never shown. Azure Cache for Redis hands out its
// access key as a StackExchange.Redis connection string
// ("name.redis.cache.windows.net:6380,password=KEY,ssl=True,abortConnect=False"),
// and operators paste that into REDIS_URL. It is not a URL and must be
// refused, but the refusal (stderr, the pod's log, CI output) must not
// carry the access key, neither in the value it quotes nor in the
// parser's reason.
func TestRedisURLConnectionStringPasswordNotShown(t *testing.T) {
	const key = "AzureAccessKey0123456789abcdefXYZ="
	for _, v := range []string{
		"contoso.redis.cache.windows.net:6380,password=" + key + ",ssl=True,abortConnect=False",
		"redis://contoso.redis.cache.windows.net:6380,password=" + key,
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "REDIS_URL=" + v})
		if err == nil {
			t.Errorf("REDIS_URL=%s accepted", strings.Replace(v, key, "KEY", 1))
			continue
		}
		if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), key[:12]) {
			t.Errorf("the refusal of a connection string shows its password:\n%v", err)
		}
	}
}

// TestRedisURLBadOptionIsNamed: a REDIS_URL whose query has a bad option
// must say which option is wrong. Hiding the query (it may carry
// ?password=) is right, but then the reason has to name the parameter:
// "malformed URL" alone leaves the operator guessing at a value the message
// does not show, with the pod crash-looping.
func TestRedisURLBadOptionIsNamed(t *testing.T) {
	_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000",
		"REDIS_URL=redis://127.0.0.1:6379/0?dial_timeout=5seconds&pool_size=20"})
	if err == nil {
		t.Fatal("a bad dial_timeout accepted")
	}
	if !strings.Contains(err.Error(), "dial_timeout") {
		t.Errorf("the refusal does not name the bad option dial_timeout:\n%v", err)
	}
}
