package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxEngineKeyConfigBytes bounds an engine's JSON key configuration.
const MaxEngineKeyConfigBytes = 1 << 20

// Engines whose JSON configuration ParseEngineKeyConfig reads.
const (
	EngineConfigVLLM   = "vLLM"
	EngineConfigSGLang = "SGLang"
)

// EngineKeyConfig is what an engine's JSON connector configuration says about its pool keys:
// vLLM's --kv-transfer-config, or SGLang's --hicache-storage-backend-extra-config.
type EngineKeyConfig struct {
	// Engine is EngineConfigVLLM (the JSON names a kv_connector) or EngineConfigSGLang.
	Engine string
	// Connector is vLLM's kv_connector.
	Connector string
	// CachePrefix is vLLM's kv_connector_extra_config.cache_prefix, as the connector reads it
	// (str() of the value); HasCachePrefix tells an absent one from "".
	CachePrefix    string
	HasCachePrefix bool
	// BackendTag and TPLCMSize are SGLang's extra_backend_tag and tp_lcm_size (0: absent).
	BackendTag    string
	HasBackendTag bool
	TPLCMSize     int
}

// ParseEngineKeyConfig reads an engine's JSON connector configuration. A vLLM configuration
// must name a Mooncake store connector: another connector's keys are not the ones kvctl derives.
func ParseEngineKeyConfig(data []byte) (EngineKeyConfig, error) {
	var c EngineKeyConfig
	if len(data) > MaxEngineKeyConfigBytes {
		return c, fmt.Errorf("engine configuration of %d bytes: at most %d", len(data), MaxEngineKeyConfigBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return c, fmt.Errorf("engine configuration: not a JSON object: %w", err)
	}
	if dec.More() {
		return c, errors.New("engine configuration: data after the JSON object")
	}
	if conn, ok := m["kv_connector"]; ok {
		c.Engine = EngineConfigVLLM
		s, ok := conn.(string)
		if !ok {
			return c, fmt.Errorf("kv_connector %v: want a string", conn)
		}
		c.Connector = s
		if !strings.Contains(s, "MooncakeStore") {
			return c, fmt.Errorf("kv_connector %q: kvctl derives the keys of vLLM's MooncakeStoreConnector only", s)
		}
		extra, ok := m["kv_connector_extra_config"]
		if !ok || extra == nil {
			return c, nil
		}
		em, ok := extra.(map[string]any)
		if !ok {
			return c, fmt.Errorf("kv_connector_extra_config: want a JSON object")
		}
		if v, ok := em["cache_prefix"]; ok {
			s, err := pyStr(v)
			if err != nil {
				return c, fmt.Errorf("kv_connector_extra_config.cache_prefix: %w", err)
			}
			c.CachePrefix, c.HasCachePrefix = s, true
		}
		return c, nil
	}
	c.Engine = EngineConfigSGLang
	if v, ok := m["extra_backend_tag"]; ok && v != nil {
		s, err := pyStr(v)
		if err != nil {
			return c, fmt.Errorf("extra_backend_tag: %w", err)
		}
		c.BackendTag, c.HasBackendTag = s, true
	}
	if v, ok := m["tp_lcm_size"]; ok && v != nil {
		var n int64
		var err error
		switch x := v.(type) {
		case json.Number:
			n, err = x.Int64()
		case string:
			n, err = strconv.ParseInt(x, 10, 64)
		default:
			err = errors.New("not an integer")
		}
		if err != nil || n < 1 || n > 1<<16 {
			return c, fmt.Errorf("tp_lcm_size %v: want an integer in [1, 65536]", v)
		}
		c.TPLCMSize = int(n)
	}
	return c, nil
}

// pyStr is str(v) for the JSON scalars an engine's str() would see.
func pyStr(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	case bool:
		if x {
			return "True", nil
		}
		return "False", nil
	}
	return "", fmt.Errorf("%v: want a string or number", v)
}
