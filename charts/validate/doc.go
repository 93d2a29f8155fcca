// Package validate holds the tests of the idemproxy Helm chart (charts/idemproxy): they
// render it with `helm template` for the default values and each ci/*-values.yaml, decode
// every manifest into the k8s.io/api types in strict mode (an unknown or misspelled field
// fails), check the chart's semantics, and parse the rendered ROUTES string with the proxy's
// own parser.
//
// The helm binary is taken from $HELM, else from PATH; install-helm.sh installs the pinned
// version. The alerts (templates/prometheusrule.yaml) are checked and unit-tested with promtool
// (testdata/alerts_test.yaml against the rendered rules), taken from $PROMTOOL, else from PATH;
// install-promtool.sh installs it. Without promtool those tests skip, unless CI=true.
// Run: cd charts/validate && go test -count=1 ./...
//
// -count=1 matters: go test caches a passing result and only re-runs when the files the test
// itself opened change, and only files inside this module count. The chart (../idemproxy) and
// the helm binary are outside it, so a cached PASS would survive a change to a template.
package validate
