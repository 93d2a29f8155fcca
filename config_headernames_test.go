package main

import (
	"strings"
	"testing"
)

// TestHeaderNamesNoRequestCanCarryStopTheStart
//
// Defect: SCOPE_HEADERS is checked only for empty names, and
// IDEMPOTENCY_HEADER only for spaces, tabs, ':' and ','. A value copied
// with its quotes (`docker run --env-file` keeps them:
// SCOPE_HEADERS="Authorization"), or a list written with ';', names a
// header no request can carry. The proxy starts without a word: with such a
// SCOPE_HEADERS every caller falls into the one anonymous scope, so one
// tenant's recorded answer is replayed to another tenant that reuses its
// key; with such an IDEMPOTENCY_HEADER no request is ever keyed.
//
// Contract: "A malformed value stops the process at start" (Part 1) and,
// for Part 2, "a bad value stops the process with a message that names the
// variable ... and the value"; the README: "Header and scope names must be
// RFC 9110 tokens; a name no request can carry stops the process at
// start". Route scope= already refuses exactly these names.
func TestHeaderNamesNoRequestCanCarryStopTheStart(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"SCOPE_HEADERS", `"Authorization"`},
		{"SCOPE_HEADERS", `Authorization;X-Tenant-Id`},
		{"SCOPE_HEADERS", `X-Tenant/Id`},
		{"IDEMPOTENCY_HEADER", `"Idempotency-Key"`},
		{"IDEMPOTENCY_HEADER", `Idempotency-Key;`},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", tc.name + "=" + tc.value})
			if err == nil {
				t.Errorf("%s=%s: accepted; no request can carry a header of that name", tc.name, tc.value)
				return
			}
			if !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), strings.Trim(tc.value, `"`)) {
				t.Errorf("refusal does not name %s and its value: %v", tc.name, err)
			}
		})
	}
}

// TestMethodsMustBeTokens: a method copied with its quotes, or written with a
// separator, is no method a request carries: every request would pass
// unkeyed.
func TestMethodsMustBeTokens(t *testing.T) {
	for _, v := range []string{`"POST"`, `POST;PUT`, `PO ST`, `POST,`} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", "METHODS=" + v})
		if err == nil || !strings.Contains(err.Error(), "METHODS") {
			t.Errorf("METHODS=%s: %v; want a refusal naming METHODS", v, err)
		}
	}
	for _, v := range []string{"POST", "post, put", "PATCH,DELETE"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:1", "METHODS=" + v}); err != nil {
			t.Errorf("METHODS=%s: %v; want it accepted", v, err)
		}
	}
}
