package pool

// Stats is a snapshot of what any backend can report about itself: occupancy, traffic and
// evictions. Counters only grow. A backend's own figures (the embedded pool's eviction passes
// and free-space shape, a Mooncake master's soft-pin count) go in Detail under the JSON names
// `/v1/stats` gives them in its "pool" object, and the backend's registry entry lists those
// names (Backend.StatsDetail).
type Stats struct {
	CapacityBytes int64
	UsedBytes     int64
	Objects       int64

	Hits            int64
	Misses          int64
	Puts            int64
	SkippedExisting int64
	PutFailures     int64
	BytesIn         int64
	BytesOut        int64
	ChecksumErrors  int64
	// AllocFailures counts puts refused because the pool had no room for the object.
	AllocFailures int64
	// Evicted counts objects the pool dropped to make room.
	Evicted int64

	// Detail holds the backend's own counters and gauges by name; nil when it has none.
	Detail map[string]int64 `json:"-"`
}
