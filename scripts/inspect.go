package scripts

import _ "embed"

// Inspect reads one record for an operator, writing nothing (inspect.lua).
//
//go:embed inspect.lua
var Inspect string
