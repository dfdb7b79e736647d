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
		return &readError{err}
	}
	return v.ReadConfig(bytes.NewReader(data))
}

// readError is a config file that could not be read (missing, a directory, no permission), as
// opposed to one that was read and is invalid.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }
