package claim

import "time"

// The tests watch purges with a probe every second instead of every ten, so
// that idleness and a switched master take seconds to show. Set before any
// test runs.
func init() { purgeProbeEvery = time.Second }

// PurgeProbeEvery is the probe period the tests run with.
func PurgeProbeEvery() time.Duration { return purgeProbeEvery }
