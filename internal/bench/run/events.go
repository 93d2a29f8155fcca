package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The 1 KiB webhook workloads send the same Stripe-event-like
// JSON body, whose top-level "id" is a fresh key per request:
//
//   - unique1k: the key also in the Idempotency-Key header, to a route keyed
//     by that header (the default);
//   - json1k: no header, to a route whose ROUTES rule takes the key from the
//     body (key=json:/id).
//
// Both routes have a ROUTES rule, so the two differ only in where the key
// comes from. The driver owns the body: it writes eventTemplate to a file
// that workload.lua reads, and wrk puts the key where eventIDPlaceholder is,
// as eventBody does for the driver's own requests (priming, probe).
const (
	eventIDPlaceholder = "@EVENT_ID@"
	eventKeyPrefix     = "evt_" // of every key (and id) of these workloads, as Stripe's event ids
)

// eventWorkload describes a workload whose requests carry eventBody.
type eventWorkload struct {
	path      string // request path, on both proxies
	rule      string // ROUTES rule idemproxy gets for this workload
	keyHeader bool   // whether the key is also sent in Idempotency-Key
}

var eventWorkloads = map[string]eventWorkload{
	"unique1k": {path: "/hooks/header", rule: "POST /hooks/header", keyHeader: true},
	"json1k":   {path: "/hooks/stripe", rule: "POST /hooks/stripe key=json:/id", keyHeader: false},
}

// eventTemplate is a payment_intent.succeeded event as Stripe sends it
// (API version 2024-06-20), compacted; eventIDPlaceholder stands for the
// event id. With the ids of a run (about 45 bytes) the body is about 1 KiB.
var eventTemplate = compactJSON(`{
  "id": "` + eventIDPlaceholder + `",
  "object": "event",
  "api_version": "2024-06-20",
  "created": 1732329600,
  "data": {
    "object": {
      "id": "pi_3QNxR2LkdIwHu7ix0Y9b8kZq",
      "object": "payment_intent",
      "amount": 2000,
      "amount_capturable": 0,
      "amount_received": 2000,
      "application": null,
      "application_fee_amount": null,
      "canceled_at": null,
      "capture_method": "automatic",
      "client_secret": "pi_3QNxR2LkdIwHu7ix0Y9b8kZq_secret_Vn3QeJ2mB7rT5xW9cK1d",
      "confirmation_method": "automatic",
      "created": 1732329598,
      "currency": "eur",
      "customer": "cus_R4gHj2kLmN8pQr",
      "description": "Order #10482, 2 items",
      "latest_charge": "ch_3QNxR2LkdIwHu7ix0bT4cV2n",
      "livemode": false,
      "metadata": {"order_id": "10482", "cart_id": "c_77f1e2"},
      "payment_method": "pm_1QNxR1LkdIwHu7ixA9sD3fGh",
      "payment_method_types": ["card"],
      "receipt_email": "jenny.rosen@example.com",
      "statement_descriptor": null,
      "status": "succeeded"
    }
  },
  "livemode": false,
  "pending_webhooks": 1,
  "request": {"id": "req_8fGh2JkL3mNpQs", "idempotency_key": "a3f1c9e2-7b4d-4e8a-9c1f-2d6b8e0a4f37"},
  "type": "payment_intent.succeeded"
}`)

func compactJSON(s string) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		panic("eventTemplate: " + err.Error())
	}
	return buf.String()
}

// eventBody is the body of a request of an event workload with key id.
// workload.lua builds the same bytes from eventTemplate.
func eventBody(id string) string {
	return strings.Replace(eventTemplate, eventIDPlaceholder, id, 1)
}

// roundTag is the prefix of every key of one round of one target: unique per
// run (runID), delay, workload, round and target, so that no key repeats
// across rounds. The event workloads' keys start with eventKeyPrefix.
func roundTag(runID string, delay time.Duration, wl string, r int, kind string) string {
	tag := fmt.Sprintf("%s-%dus-%s-%d-%s", runID, delay.Microseconds(), wl, r, kind)
	if _, ok := eventWorkloads[wl]; ok {
		tag = eventKeyPrefix + tag
	}
	return tag
}

// workloadPath is the request path of workload wl.
func workloadPath(wl string) string {
	if ew, ok := eventWorkloads[wl]; ok {
		return ew.path
	}
	return "/v1/orders"
}

// idemEnvFor is idemproxy's extra environment for workload wl: user (the
// -idem-env values) with the workload's ROUTES rule, if it has one, in front
// of the ROUTES given there (the last one, as exec would take).
func idemEnvFor(user []string, wl string) []string {
	ew, ok := eventWorkloads[wl]
	if !ok {
		return user
	}
	routes := ew.rule
	out := make([]string, 0, len(user)+1)
	for _, kv := range user {
		if v, ok := strings.CutPrefix(kv, "ROUTES="); ok {
			routes = ew.rule
			if strings.TrimSpace(v) != "" {
				routes += "; " + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "ROUTES="+routes)
}
