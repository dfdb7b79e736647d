package serve

import (
	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/core/config"
)

// addSecurityFlags adds the flags that decide who may reach the daemon and what the admin API
// may do (docs/SECURITY.md).
func addSecurityFlags(cmd *cobra.Command, opts *Options) {
	fl := cmd.Flags()
	fl.StringVar(&opts.Security.EngineGroup, config.ServeKeyEngineGroup, "", "also admit engines running as members of this `group` (name or gid) to the engine socket; the socket directory may then be group-readable (0750) by that group")
	fl.IntVar(&opts.Security.MaxConns, config.ServeKeyMaxConns, 0, "cap on concurrent connections per listener (engine socket, descriptor channel, admin); 0 = 1024, lowered to fit the open-file limit")
	fl.BoolVar(&opts.Security.AdminGrantsLeases, config.ServeKeyAdminGrantsLeases, false, "let the admin API's /query_key grant read leases like a Mooncake master (needed by probe-pool --renew-leases); off, it answers 403")
	fl.DurationVar(&opts.Security.DescriptorTTL, config.ServeKeyDescriptorTTL, 0, "how long a memory descriptor sent to the side channel waits for its Register before it is closed (0 = 30s)")
	fl.Int64Var(&opts.Security.MaxTrackedTokens, config.ServeKeyMaxTrackedTokens, 0, "daemon-wide budget of tokens the engines' unfinished requests may hold (one connection may take half, one uid three quarters); past it new lookups get ResourceExhausted (0 = a quarter of the memory available at start, at 16 bytes a token)")
	fl.BoolVar(&opts.Security.AdminPprof, config.ServeKeyAdminPprof, false, "serve Go's runtime profiles (CPU, heap, goroutines, execution trace; each at most 60s) under /debug/pprof/ on the admin address; off, they answer 404")
	fl.Float64Var(&opts.Security.AdminLeaseRate, config.ServeKeyAdminLeaseRate, 0, "most /query_key lease grants per second with --admin-grants-leases (0 = 200); more get 429")
}
