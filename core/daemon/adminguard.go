package daemon

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// The admin API has no authentication, so it serves only what any local user may see. Its one
// endpoint with a side effect on the pool is /query_key: like a Mooncake master's it grants the
// key a read lease, and a loop of such requests pins keys the pool needs to evict, failing
// puts. It is off unless Config.AdminGrantsLeases is set, and rate-limited when on.

// guardQueryKey wraps the master handler's /query_key with the lease switch and rate limit.
func (d *Daemon) guardQueryKey(master http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d.sec.leases == nil {
			adminRefuse(w, http.StatusForbidden, "/query_key grants read leases and is off on this kvctl serve; use /batch_query_keys (read-only), or start kvctl serve with --admin-grants-leases")
			return
		}
		if !d.sec.leases.allow() {
			w.Header().Set("Retry-After", "1")
			adminRefuse(w, http.StatusTooManyRequests, "/query_key lease grants are over the rate of "+strconv.FormatFloat(d.sec.leases.rate, 'f', -1, 64)+" a second (--admin-lease-rate)")
			return
		}
		master.ServeHTTP(w, r)
	}
}

func adminRefuse(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(struct {
		Success bool   `json:"success"`
		Code    int    `json:"error_code"`
		Message string `json:"error_message"`
	}{false, -1, msg})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
