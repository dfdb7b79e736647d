package cmdutil

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// ParseDuration reads a duration the one way every kvctl flag, environment variable and config
// key takes it: a Go duration ("30s", "1m30s", "500ms") or a plain number of seconds ("30",
// "0.5"), as validate-config reads a config file's durations.
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty duration: want a number of seconds or a duration such as 30s")
	}
	if f, err := strconv.ParseFloat(t, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("%q is not a usable number of seconds", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration: want a number of seconds or a duration such as 30s", s)
	}
	return d, nil
}

type durationValue struct{ p *time.Duration }

func (v durationValue) String() string {
	if v.p == nil {
		return "0s"
	}
	return v.p.String()
}

func (v durationValue) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*v.p = d
	return nil
}

func (v durationValue) Type() string { return "duration" }

// DurationVar defines a duration flag that takes a Go duration or a number of seconds.
func DurationVar(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(durationValue{p}, name, usage)
}

type secondsValue struct{ p *int }

func (v secondsValue) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(*v.p)
}

func (v secondsValue) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	if d%time.Second != 0 {
		return fmt.Errorf("%q: want whole seconds", s)
	}
	secs := d / time.Second
	if secs > math.MaxInt32 || secs < math.MinInt32 {
		return fmt.Errorf("%q is too long", s)
	}
	*v.p = int(secs)
	return nil
}

func (v secondsValue) Type() string { return "duration" }

// SecondsVar defines a flag kept as whole seconds that takes a Go duration ("5s", "1m") or a
// number of seconds ("5"), like every other duration flag.
func SecondsVar(fs *pflag.FlagSet, p *int, name string, def int, usage string) {
	*p = def
	fs.Var(secondsValue{p}, name, usage)
}
