package validateconfig

import "github.com/kvctl/kvctl/core/config"

// clusterDiagnostics checks a serve config of the mooncake backend as serve would start it:
// the mooncake.json and pool manifest it names are read and merged, so a TensorRT-LLM client
// config with a protocol or metadata server kvctl cannot use, or a missing metadata server, is
// reported here, before serve. Nothing is dialled. A key Load already reported is not reported
// twice.
func clusterDiagnostics(f *config.File, have config.Diagnostics, read func(string) ([]byte, error)) config.Diagnostics {
	if f == nil || f.Serve == nil || f.Serve.PoolBackend != config.PoolBackendMooncake {
		return nil
	}
	seen := map[string]bool{}
	for _, d := range have {
		seen[d.Path] = true
	}
	_, diags := f.Serve.ResolveCluster(read)
	var out config.Diagnostics
	for _, d := range diags {
		if d.File == "" && seen[d.Path] {
			continue
		}
		if d.File == "" {
			d.File = f.Name
		}
		out = append(out, d)
	}
	return out
}
