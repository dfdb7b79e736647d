package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// SizeError explains why a size value was refused. It wraps ErrSize.
type SizeError struct {
	Value  string // the value as written
	Reason string
	Hint   string // a corrected spelling, when one exists
}

func (e *SizeError) Error() string {
	if e.Hint != "" {
		return fmt.Sprintf("size %s: %s (%s)", e.Value, e.Reason, e.Hint)
	}
	return fmt.Sprintf("size %s: %s", e.Value, e.Reason)
}

func (e *SizeError) Unwrap() error { return ErrSize }

var binaryUnits = map[string]float64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

var decimalUnits = map[string]float64{
	"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
}

// ParseSize reads a byte count the way TensorRT-LLM's parse_size does: a bool is refused, an
// integer is returned as is, a float is truncated, and a string is a decimal magnitude
// (digits, optionally a fraction) followed by an optional case-insensitive unit. B and the
// binary units KiB..TiB are always accepted; the decimal units k/kb..t/tb scale by 1000 and
// are refused when strict is set, because vLLM reads them as 1024-based. The result of a
// string is the magnitude times the scale, truncated toward zero.
//
// v may be any Go integer or float type, a bool, a string, or nil.
func ParseSize(v any, strict bool) (int64, error) {
	switch x := v.(type) {
	case bool:
		return 0, &SizeError{Value: strconv.FormatBool(x), Reason: "a boolean is not a size"}
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case uint:
		return uintSize(uint64(x))
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return uintSize(x)
	case float32:
		return floatSize(float64(x), formatPyFloat(float64(x)))
	case float64:
		return floatSize(x, formatPyFloat(x))
	case string:
		return parseSizeString(x, strict)
	case nil:
		return 0, &SizeError{Value: "null", Reason: "want a byte count or a size string such as \"4GiB\""}
	default:
		return 0, &SizeError{Value: fmt.Sprintf("%v", v), Reason: fmt.Sprintf("a %T is not a size", v)}
	}
}

func uintSize(u uint64) (int64, error) {
	if u > math.MaxInt64 {
		return 0, &SizeError{Value: strconv.FormatUint(u, 10), Reason: "too large"}
	}
	return int64(u), nil
}

func floatSize(f float64, text string) (int64, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, &SizeError{Value: text, Reason: "not a finite number"}
	}
	t := math.Trunc(f)
	if t >= 0x1p63 || t < -0x1p63 {
		return 0, &SizeError{Value: text, Reason: "too large"}
	}
	return int64(t), nil
}

func parseSizeString(s string, strict bool) (int64, error) {
	q := strconv.Quote(s)
	body := strings.TrimFunc(s, unicode.IsSpace)
	i := 0
	for i < len(body) && body[i] >= '0' && body[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, &SizeError{Value: q, Reason: "want digits followed by an optional unit such as GiB"}
	}
	if i < len(body) && body[i] == '.' {
		j := i + 1
		for j < len(body) && body[j] >= '0' && body[j] <= '9' {
			j++
		}
		if j == i+1 {
			return 0, &SizeError{Value: q, Reason: "a fraction needs digits after the point"}
		}
		i = j
	}
	mag := body[:i]
	unit := strings.TrimLeftFunc(body[i:], unicode.IsSpace)
	for _, r := range unit {
		if r > unicode.MaxASCII || !unicode.IsLetter(r) {
			return 0, &SizeError{Value: q, Reason: "want digits followed by an optional unit such as GiB"}
		}
	}
	lu := strings.ToLower(unit)
	scale, ok := binaryUnits[lu]
	if !ok {
		dscale, dec := decimalUnits[lu]
		if !dec {
			return 0, &SizeError{Value: q, Reason: fmt.Sprintf("unknown unit %q", unit),
				Hint: "use B, KiB, MiB, GiB or TiB"}
		}
		if strict {
			bin := strings.ToUpper(lu[:1]) + "iB"
			return 0, &SizeError{Value: q,
				Reason: fmt.Sprintf("decimal unit %q is read as 1024-based by vLLM, so it is refused", unit),
				Hint:   fmt.Sprintf("write %q", mag+bin)}
		}
		scale = dscale
	}
	f, err := strconv.ParseFloat(mag, 64)
	if err != nil {
		return 0, &SizeError{Value: q, Reason: "magnitude out of range"}
	}
	return floatSize(f*scale, q)
}

// FormatSize writes a byte count in the largest binary unit that divides it exactly, so that
// ParseSize(FormatSize(n), true) == n.
func FormatSize(n int64) string {
	units := []struct {
		name  string
		scale int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n != 0 && n%u.scale == 0 {
			return strconv.FormatInt(n/u.scale, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// FormatSizeHuman writes a byte count for people: whole bytes below 1 KiB ("512B"), else one
// decimal in the largest binary unit it reaches ("1.5GiB"). It is FormatBytes(n, 1, "").
func FormatSizeHuman(n int64) string { return FormatBytes(n, 1, "") }

// FormatBytes is kvctl's one human size formatter (status page, tables, log lines, kvctl stats):
// whole bytes below 1 KiB, else decimals digits in the largest binary unit the count reaches,
// with sep between the number and the unit ("64.00 MiB" for 2 and " "). FormatSize is the exact
// one for configs.
func FormatBytes(n int64, decimals int, sep string) string {
	const unit = 1024
	if n < unit && n > -unit {
		return strconv.FormatInt(n, 10) + sep + "B"
	}
	f, i := float64(n), 0
	for (f >= unit || f <= -unit) && i < 6 {
		f /= unit
		i++
	}
	return strconv.FormatFloat(f, 'f', decimals, 64) + sep + [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}[i]
}

// formatPyFloat writes a float64 the way Python's repr does: the shortest digits that read
// back exactly, fixed notation for exponents in [-4, 16) with a ".0" on integral values, and
// otherwise scientific notation with a signed exponent of at least two digits.
func formatPyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // like -1.2345e+06
	neg := strings.HasPrefix(e, "-")
	e = strings.TrimPrefix(e, "-")
	mant, expText, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expText)
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	if exp >= -4 && exp < 16 {
		if exp < 0 {
			out = "0." + strings.Repeat("0", -exp-1) + digits
		} else if len(digits) <= exp+1 {
			out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
		} else {
			out = digits[:exp+1] + "." + digits[exp+1:]
		}
	} else {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		sign := "+"
		if exp < 0 {
			sign = "-"
			exp = -exp
		}
		out = fmt.Sprintf("%se%s%02d", m, sign, exp)
	}
	if neg {
		out = "-" + out
	}
	return out
}
