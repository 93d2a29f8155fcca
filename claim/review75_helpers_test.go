package claim_test

import "strings"

// r75enc encodes a string record as the scripts do.
func r75enc(st, tok, fp, up, at, ld, ct, tr, rec string) string {
	return "R2" + string([]byte{byte(len(st)), byte(len(tok)), byte(len(fp)), byte(len(up)), byte(len(at)),
		byte(len(ld)), byte(len(ct)), byte(len(tr))}) + st + tok + fp + up + at + ld + ct + tr + rec
}

const (
	r75tok   = "tokentokentoken1" // the caller's token (16 bytes)
	r75other = "othertokenother2"
	r75up    = "upstreamupstream"
)

var r75fp = strings.Repeat("f", 32)
