package validate

import (
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview12OffRouteWithEnforceFalse: the off/upgrade check in
// _helpers.tpl tests each option with `index $r $opt`, so `observe: false`
// (the chart's spelling of the route option enforce) passes it as "unset",
// but the renderer appends the option whenever the key is present
// (hasKey): an off route renders "POST /a off enforce", which the proxy
// refuses at start ("options off and upgrade cannot be combined"), i.e. a
// CrashLoopBackOff instead of a helm error. The chart must never emit a
// ROUTES the proxy refuses: fail the render, as for every other option.
func TestReview12OffRouteWithEnforceFalse(t *testing.T) {
	for _, kind := range []string{"off", "upgrade"} {
		t.Run(kind, func(t *testing.T) {
			out, err := render(t, "--set", "config.routes[0].method=GET,config.routes[0].pattern=/a,config.routes[0]."+kind+"=true,config.routes[0].observe=false")
			if err != nil {
				if !strings.Contains(err.Error(), "off means plain pass-through") {
					t.Errorf("render error %v, want the off/upgrade message", err)
				}
				return
			}
			m := decodeAll(t, out)
			spec := m.configMap(m.deployment.Name).Data["ROUTES"]
			if _, err := proxy.ParseRoutes(spec); err != nil {
				t.Errorf("chart rendered ROUTES=%q, which the proxy refuses at start: %v", spec, err)
			}
		})
	}
}
