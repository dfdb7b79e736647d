package validateconfig

import (
	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/config"
)

// serveDiagnostics checks a serve config as serve would start it, through the resolution serve
// itself runs (config.ServeConfig.Resolve): the pool size against its minimum, and for the
// mooncake backend the mooncake.json and pool manifest it names, read and merged, so a
// TensorRT-LLM client config with a protocol or metadata server kvctl cannot use, or a missing
// metadata server, is reported here, before serve. Nothing is dialled, and the automatic pool
// size is left to the host that runs serve. A problem Load already reported is not reported
// twice.
func serveDiagnostics(f *config.File, have config.Diagnostics, read func(string) ([]byte, error)) config.Diagnostics {
	if f == nil || f.Serve == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, d := range have {
		seen[d.Path] = true
		seen[d.Path+"\x00"+d.Message] = true
	}
	_, diags := f.Serve.Resolve(config.ResolveOptions{ReadFile: read})
	var out config.Diagnostics
	for _, d := range diags {
		if d.File == "" && (seen[d.Path+"\x00"+d.Message] || (f.Serve.PoolBackend == config.PoolBackendMooncake && seen[d.Path])) {
			continue
		}
		if d.File == "" {
			d.File = f.Name
		}
		out = append(out, d)
	}
	return out
}

// ForServe is --for serve: check a file as kvctl serve reads it.
const ForServe = "serve"

// forServe checks a mooncake.json as `kvctl serve --pool-backend mooncake --mooncake-config`
// reads it, through the same resolution serve runs. A serve config is already checked that
// way; other kinds have no serve reading and are a usage error.
func forServe(f *config.File, name string, data []byte) (config.Diagnostics, error) {
	if f == nil {
		return nil, nil // the file did not parse: its own diagnostics say why
	}
	switch f.Kind {
	case config.KindServe:
		return nil, nil
	case config.KindClient:
	default:
		return nil, cmdutil.FlagErrorf("--for serve checks a mooncake.json or a kvctl serve config; %s is a %s", name, f.Kind)
	}
	sc := config.DefaultServeConfig()
	sc.PoolBackend, sc.MooncakeConfig = config.PoolBackendMooncake, name
	_, diags := sc.Resolve(config.ResolveOptions{ReadFile: func(string) ([]byte, error) { return data, nil }})
	var out config.Diagnostics
	for _, d := range diags {
		if d.File != "" {
			continue // the file's own problems: Load reported them already
		}
		d.File = name
		d.Message += " (for kvctl serve --mooncake-config)"
		out = append(out, d)
	}
	return out, nil
}
