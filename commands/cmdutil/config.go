package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/kvctl/kvctl/core/boundedio"
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
			case errors.As(err, new(*readError)) && !errors.Is(err, boundedio.ErrTooLarge):
				// A file that cannot be read fails at run time (exit 1) in every command.
				return nil, fmt.Errorf("config file %s: %w", path, err)
			default:
				return nil, &ExitError{Code: ExitValidation, Err: fmt.Errorf("config file %s: %w", path, err)}
			}
		}
	}

	if v.ConfigFileUsed() != "" && cmd.Annotations[OwnConfigCheck] == "" {
		if err := checkKeys(cmd.Root(), v); err != nil {
			return nil, err
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
		src := source(v, fl.Name)
		val := v.Get(fl.Name)
		var err error
		switch x := val.(type) {
		case []any:
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			// A YAML list for a repeatable flag: each item is one value, commas and all.
			if sv, ok := fl.Value.(pflag.SliceValue); ok {
				err = sv.Replace(parts)
			} else {
				err = fl.Value.Set(strings.Join(parts, ","))
			}
		default:
			err = fl.Value.Set(fmt.Sprint(x))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", src, describeSetting(src, fl.Name), err))
			return
		}
		fl.Changed = true
		if fl.Annotations == nil {
			fl.Annotations = map[string][]string{}
		}
		fl.Annotations[sourceAnnotation] = []string{src}
	}
	cmd.Flags().VisitAll(apply)
	cmd.InheritedFlags().VisitAll(apply)
	if len(errs) > 0 {
		return nil, &ExitError{Code: ExitUsage, Err: errors.Join(errs...)}
	}
	return v, nil
}

// OwnConfigCheck is a command annotation: the command checks the config file's keys itself
// (with places and suggestions), so LoadConfig leaves them to it.
const OwnConfigCheck = "kvctl-own-config-check"

// sourceAnnotation marks a flag whose value came from the environment or the config file; its
// value names which.
const sourceAnnotation = "kvctl-source"

// FlagSource names where flag name of cmd got its value: "" for the command line or its
// default, else the environment variable (KVCTL_POOL_SIZE) or the config file's path.
func FlagSource(cmd *cobra.Command, name string) string {
	fl := cmd.Flags().Lookup(name)
	if fl == nil {
		return ""
	}
	if s := fl.Annotations[sourceAnnotation]; len(s) > 0 {
		return s[0]
	}
	return ""
}

// FromCommandLine reports whether flag name of cmd was given on the command line.
func FromCommandLine(cmd *cobra.Command, name string) bool {
	fl := cmd.Flags().Lookup(name)
	return fl != nil && fl.Changed && FlagSource(cmd, name) == ""
}

func describeSetting(src, name string) string {
	if strings.HasPrefix(src, EnvPrefix+"_") {
		return "(for --" + name + ")"
	}
	return "key " + strconv.Quote(name)
}

// checkKeys refuses a config file key that is no flag of any kvctl command: a file shared by
// several commands may hold every command's keys, and each command ignores the others', but
// a misspelt key is an error.
func checkKeys(root *cobra.Command, v *viper.Viper) error {
	known := map[string]bool{"config": true}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(fl *pflag.Flag) { known[fl.Name] = true })
		c.PersistentFlags().VisitAll(func(fl *pflag.Flag) { known[fl.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	var bad []string
	seen := map[string]bool{}
	for _, k := range v.AllKeys() {
		top, _, _ := strings.Cut(k, ".")
		if !known[top] && !seen[top] && fileHasKey(v, top) {
			seen[top] = true
			bad = append(bad, strconv.Quote(top))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return &ExitError{Code: ExitValidation, Err: fmt.Errorf("config file %s: unknown key %s: no kvctl command has such a flag", v.ConfigFileUsed(), strings.Join(bad, ", "))}
}

// fileHasKey tells a key of the config file from one viper only knows from the environment.
func fileHasKey(v *viper.Viper, key string) bool {
	return v.InConfig(key)
}

// AllFlagNames lists the flag names of every command of the tree cmd belongs to, except
// those of cmd itself: the keys a shared config file may hold for other commands.
func AllFlagNames(cmd *cobra.Command) []string {
	own := map[string]bool{}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) { own[fl.Name] = true })
	set := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(fl *pflag.Flag) {
			if !own[fl.Name] {
				set[fl.Name] = true
			}
		})
		c.PersistentFlags().VisitAll(func(fl *pflag.Flag) {
			if !own[fl.Name] {
				set[fl.Name] = true
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.Root())
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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
