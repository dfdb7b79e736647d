package config

import (
	"os"
	"testing"
)

// BenchmarkLoadTRTLLMYAML measures parse, schema and every rule on a typical TensorRT-LLM YAML.
func BenchmarkLoadTRTLLMYAML(b *testing.B) {
	data, err := os.ReadFile("testdata/valid/typical.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ds := Load("typical.yaml", data, LoadOptions{}); ds.HasErrors() {
			b.Fatal(ds.Err())
		}
	}
}

func BenchmarkLoadClientJSON(b *testing.B) {
	data, err := os.ReadFile("testdata/valid/mooncake.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ds := Load("mooncake.json", data, LoadOptions{}); ds.HasErrors() {
			b.Fatal(ds.Err())
		}
	}
}
