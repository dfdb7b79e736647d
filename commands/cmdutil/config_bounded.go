package cmdutil

import (
	"bytes"
	"context"

	"github.com/spf13/viper"

	"github.com/kvctl/kvctl/core/boundedio"
)

// readConfigBounded reads the config file at path into v through boundedio's limit.
func readConfigBounded(ctx context.Context, v *viper.Viper, path string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	data, err := boundedio.ReadFile(ctx, path, boundedio.MaxConfigBytes)
	if err != nil {
		return err
	}
	return v.ReadConfig(bytes.NewReader(data))
}
