package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// EnvPrefix is the prefix of environment variables that set flags: --pool-size is
// KVCTL_POOL_SIZE.
const EnvPrefix = "KVCTL"

// DefaultConfigPath is the config file read when neither --config nor KVCTL_CONFIG names one:
// $XDG_CONFIG_HOME/kvctl/config.yaml, else ~/.config/kvctl/config.yaml.
func DefaultConfigPath(getenv func(string) string) string {
	if d := getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "kvctl", "config.yaml")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "kvctl", "config.yaml")
	}
	return ""
}

// LoadConfig builds the run's viper instance and applies it to cmd's flags so that each flag
// holds its effective value: a flag given on the command line wins, then KVCTL_* environment
// variables, then the config file (its keys are the flag names), then the flag's default.
//
// An explicitly named config file must exist; the default one may be absent.
func LoadConfig(cmd *cobra.Command, explicit string, getenv func(string) string) (*viper.Viper, error) {
	v := viper.New()
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()

	path, required := explicit, explicit != ""
	if path == "" {
		if p := getenv(EnvPrefix + "_CONFIG"); p != "" {
			path, required = p, true
		} else {
			path = DefaultConfigPath(getenv)
		}
	}
	if path != "" && !required {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			path = ""
		}
	}
	if path != "" {
		v.SetConfigFile(path)
		typ := strings.TrimPrefix(filepath.Ext(path), ".")
		if typ == "" {
			typ = "yaml"
		}
		v.SetConfigType(typ)
		// Read through a hard limit (a config named /dev/zero or a FIFO must neither exhaust
		// memory nor hang), interrupted by SIGINT/SIGTERM through the command's context.
		if err := readConfigBounded(cmd.Context(), v, path); err != nil {
			var pe *fs.PathError
			switch {
			case errors.As(err, &pe) && errors.Is(pe.Err, fs.ErrNotExist) && !required:
			case errors.Is(err, os.ErrNotExist) && !required:
			case errors.Is(err, context.Canceled):
				// Interrupted (SIGINT/SIGTERM) while reading: exit 130, not "invalid".
				return nil, fmt.Errorf("config file %s: %w", path, err)
			default:
				return nil, &ExitError{Code: ExitValidation, Err: fmt.Errorf("config file %s: %w", path, err)}
			}
		}
	}

	var errs []error
	apply := func(fl *pflag.Flag) {
		if fl.Changed || fl.Name == "config" || fl.Name == "help" {
			return
		}
		// Environment first, then the file: viper.IsSet covers both, and Get returns the value
		// with viper's own precedence (env over file).
		if !v.IsSet(fl.Name) {
			return
		}
		val := v.Get(fl.Name)
		var s string
		switch x := val.(type) {
		case []any:
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			s = strings.Join(parts, ",")
		default:
			s = fmt.Sprint(x)
		}
		if err := fl.Value.Set(s); err != nil {
			errs = append(errs, fmt.Errorf("%s (from %s): %w", fl.Name, source(v, fl.Name), err))
			return
		}
		fl.Changed = true
	}
	cmd.Flags().VisitAll(apply)
	cmd.InheritedFlags().VisitAll(apply)
	if len(errs) > 0 {
		return nil, &FlagError{Err: errors.Join(errs...)}
	}
	return v, nil
}

func source(v *viper.Viper, name string) string {
	env := EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if _, ok := os.LookupEnv(env); ok {
		return env
	}
	if f := v.ConfigFileUsed(); f != "" {
		return f
	}
	return "config"
}
