package config

import (
	"strings"
	"testing"
)

func TestParseEngineKeyConfig(t *testing.T) {
	tests := []struct {
		in      string
		want    EngineKeyConfig
		wantErr string
	}{
		{in: `{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both","kv_connector_extra_config":{"cache_prefix":"prod-a"}}`,
			want: EngineKeyConfig{Engine: EngineConfigVLLM, Connector: "MooncakeStoreConnector", CachePrefix: "prod-a", HasCachePrefix: true}},
		{in: `{"kv_connector":"MooncakeStoreConnector","kv_connector_extra_config":{"cache_prefix":7}}`,
			want: EngineKeyConfig{Engine: EngineConfigVLLM, Connector: "MooncakeStoreConnector", CachePrefix: "7", HasCachePrefix: true}},
		{in: `{"kv_connector":"MooncakeStoreConnector"}`, want: EngineKeyConfig{Engine: EngineConfigVLLM, Connector: "MooncakeStoreConnector"}},
		{in: `{"kv_connector":"LMCacheConnectorV1"}`, wantErr: "MooncakeStoreConnector only"},
		{in: `{"kv_connector":3}`, wantErr: "want a string"},
		{in: `{"kv_connector":"MooncakeStoreConnector","kv_connector_extra_config":{"cache_prefix":[1]}}`, wantErr: "cache_prefix"},
		{in: `{"master_server_address":"10.0.0.1:50051","extra_backend_tag":"tenantA","tp_lcm_size":8}`,
			want: EngineKeyConfig{Engine: EngineConfigSGLang, BackendTag: "tenantA", HasBackendTag: true, TPLCMSize: 8}},
		{in: `{"tp_lcm_size":"4"}`, want: EngineKeyConfig{Engine: EngineConfigSGLang, TPLCMSize: 4}},
		{in: `{"tp_lcm_size":0}`, wantErr: "tp_lcm_size"},
		{in: `[1]`, wantErr: "not a JSON object"},
		{in: `{} {}`, wantErr: "after the JSON object"},
		{in: `{"a":` + strings.Repeat(" ", MaxEngineKeyConfigBytes) + `1}`, wantErr: "at most"},
	}
	for _, tt := range tests {
		got, err := ParseEngineKeyConfig([]byte(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%.60s: error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%.60s: %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseEngineKeyConfig(f *testing.F) {
	f.Add([]byte(`{"kv_connector":"MooncakeStoreConnector","kv_connector_extra_config":{"cache_prefix":"p"}}`))
	f.Add([]byte(`{"extra_backend_tag":"t","tp_lcm_size":"8"}`))
	f.Add([]byte(`{"kv_connector_extra_config":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseEngineKeyConfig(data)
		if err != nil {
			return
		}
		if c.Engine != EngineConfigVLLM && c.Engine != EngineConfigSGLang {
			t.Fatalf("engine %q", c.Engine)
		}
		if c.TPLCMSize < 0 || c.TPLCMSize > 1<<16 || (c.Engine == EngineConfigVLLM) != (c.Connector != "") {
			t.Fatalf("%+v", c)
		}
	})
}
