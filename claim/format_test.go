package claim

import (
	"fmt"
	"os"
)

// CLAIM_TEST_RECORD_FORMAT=string runs this package's tests with every
// Store writing string records (RECORD_FORMAT=string); `make test` runs the
// package once each way.
func init() {
	switch f := os.Getenv("CLAIM_TEST_RECORD_FORMAT"); f {
	case "", "hash":
	case "string":
		defaultFormat = "s"
	default:
		panic(fmt.Sprintf("CLAIM_TEST_RECORD_FORMAT=%q: want hash or string", f))
	}
}
