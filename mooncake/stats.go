package mooncake

// Names of the figures Native reports in pool.Stats.Detail; they are the JSON names of the
// same figures in /v1/stats's pool object.
const (
	StatSoftPinned  = "soft_pinned_objects" // the master's soft-pinned key count
	StatExistProbes = "exist_probes"        // keys this client probed for existence
)

// NativeStatsDetail lists the Detail figures Native reports.
var NativeStatsDetail = []string{StatSoftPinned, StatExistProbes}
