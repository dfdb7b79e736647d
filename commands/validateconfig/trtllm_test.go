package validateconfig

import (
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// The LLM API YAML that docs/trtllm.md shows passes `kvctl validate-config --strict`, and the same
// file without its socket setting fails on the missing model key with the validation exit code.
func TestKvctlConnectorExample(t *testing.T) {
	const example = "../../examples/llm_api_kvctl.yaml"
	out, _, code := run(t, &Options{Files: []string{example}, Strict: true, OutputFormat: "table", RanksOnNode: 1,
		Getenv: func(string) string { return "" }})
	if code != 0 || !strings.Contains(out, "valid (trtllm-yaml): 0 errors, 0 warnings") {
		t.Fatalf("exit %d:\n%s", code, out)
	}

	data := []byte("kv_connector_config:\n  connector_module: kvctl_engine.trtllm\n" +
		"  connector_scheduler_class: KvctlConnectorScheduler\n  connector_worker_class: KvctlConnectorWorker\n")
	out, _, code = run(t, &Options{Files: []string{"llm_api.yaml"}, OutputFormat: "table", RanksOnNode: 1,
		Getenv:   func(k string) string { return map[string]string{"KVCTL_SOCKET": "/run/kvctl/kvctl.sock"}[k] },
		ReadFile: func(string) ([]byte, error) { return data, nil }})
	if code != cmdutil.ExitValidation || !strings.Contains(out, "model_key is required") {
		t.Fatalf("exit %d, want %d:\n%s", code, cmdutil.ExitValidation, out)
	}
}
