package probe

import (
	"strings"
	"testing"
)

func TestParseEngineKey(t *testing.T) {
	h64 := strings.Repeat("ab", 32)
	tests := []struct {
		engine, key string
		want        engineKey
		ok          bool
	}{
		{"vLLM", "prod-a@Qwen3-8B@tp_rank:3@pcp0@dcp0@pp_rank:1@group:0@" + h64, engineKey{"prod-a@Qwen3-8B", "@tp_rank:3@pcp0@dcp0@pp_rank:1@group:0", h64}, true},
		{"vLLM", "Llama@tp_rank:0@pcp0@dcp0@pp_rank:0@a0cdfe6ec9774666f6ea9a091a74923b", engineKey{"Llama", "@tp_rank:0@pcp0@dcp0@pp_rank:0", "a0cdfe6ec9774666f6ea9a091a74923b"}, true},
		{"vLLM", "trtllm/m/w1r0/lg0/t4b64/" + h64[:32], engineKey{}, false},
		{"vLLM", "m@tp_rank:0@XYZ", engineKey{}, false},
		{"SGLang", "tenantA_meta-llama-Llama-3.1-8B-Instruct_" + h64 + "_3_1_k", engineKey{"tenantA_meta-llama-Llama-3.1-8B-Instruct_", "3_1_k", h64}, true},
		{"SGLang", h64 + "__k", engineKey{"", "_k", h64}, true},
		{"SGLang", "x_y_z", engineKey{}, false},
	}
	for _, tt := range tests {
		got, ok := parseEngineKey(tt.engine, tt.key)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("%s %q: %+v %v, want %+v %v", tt.engine, tt.key, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseEngineKey checks that a parsed key's parts are found in it, in order.
func FuzzParseEngineKey(f *testing.F) {
	f.Add("vLLM", "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"+strings.Repeat("0", 64))
	f.Add("SGLang", "t_m_"+strings.Repeat("f", 64)+"_0_k")
	f.Fuzz(func(t *testing.T, engine, key string) {
		k, ok := parseEngineKey(engine, key)
		if !ok {
			return
		}
		if !isLowerHex(k.Hash) || !strings.HasPrefix(key, k.Model) || !strings.Contains(key, k.Hash) || !strings.Contains(key, k.Layout) {
			t.Fatalf("%q: %+v", key, k)
		}
	})
}
