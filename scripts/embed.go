// Package scripts holds the Lua scripts that claim, complete and release an
// idempotency key in Redis. They live here as .lua files so they can be read,
// reviewed and run with redis-cli on their own; package claim loads them.
package scripts

import _ "embed"

// Claim is the check-and-claim script (claim.lua).
//
//go:embed claim.lua
var Claim string

// Complete is the fenced completion script (complete.lua).
//
//go:embed complete.lua
var Complete string

// Release is the fenced release script (release.lua).
//
//go:embed release.lua
var Release string
