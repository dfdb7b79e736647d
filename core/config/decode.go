package config

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// dec collects the diagnostics of one file and the place of every key path it decoded, so
// that cross-field rules can point at the values they read.
type dec struct {
	file  string
	diags Diagnostics
	locs  map[string]pos
	bad   map[string]bool // paths whose value was refused, so rules do not report them again
}

type pos struct{ line, col int }

func newDec(file string) *dec {
	return &dec{file: file, locs: map[string]pos{}, bad: map[string]bool{}}
}

func (d *dec) add(sev Severity, line, col int, path, msg, hint string) {
	d.diags = append(d.diags, Diagnostic{File: d.file, Line: line, Column: col, Path: path,
		Severity: sev, Message: msg, Hint: hint})
}

// at records a diagnostic at the place of path, or of its nearest ancestor that the file has.
func (d *dec) at(sev Severity, path, msg, hint string) {
	p := d.where(path)
	d.add(sev, p.line, p.col, path, msg, hint)
}

// atFirst records a diagnostic about path at the first of path and alts that the file names,
// falling back to the nearest ancestor of path.
func (d *dec) atFirst(sev Severity, path, msg, hint string, alts ...string) {
	for _, p := range append([]string{path}, alts...) {
		if l, ok := d.locs[p]; ok {
			d.add(sev, l.line, l.col, path, msg, hint)
			return
		}
	}
	d.at(sev, path, msg, hint)
}

func (d *dec) where(path string) pos {
	for {
		if p, ok := d.locs[path]; ok {
			return p
		}
		if path == "" {
			return pos{}
		}
		if i := strings.LastIndexAny(path, ".["); i >= 0 {
			path = path[:i]
		} else {
			path = ""
		}
	}
}

// obj walks one mapping of the file.
type obj struct {
	d    *dec
	n    *node // nil when the mapping is absent or null
	path string
	used map[string]bool
}

// object opens the mapping at path. A missing or null value reads as an empty mapping; any
// other non-mapping is an error.
func (d *dec) object(n *node, path string) *obj {
	o := &obj{d: d, path: path, used: map[string]bool{}}
	if n == nil {
		return o
	}
	d.locs[path] = pos{n.line, n.col}
	switch {
	case n.kind == nodeMap:
		o.n = n
	case n.kind == nodeScalar && n.typ == scalarNull:
	default:
		d.add(SeverityError, n.line, n.col, path, "want a mapping, found "+n.describe(), "")
	}
	return o
}

func (o *obj) sub(key string) string { return joinPath(o.path, key) }

// field returns the value of key, or nil when the key is absent.
func (o *obj) field(key string) *node {
	o.used[key] = true
	k, v := o.n.get(key)
	if k == nil {
		return nil
	}
	o.d.locs[o.sub(key)] = pos{v.line, v.col}
	return v
}

// present reports whether the mapping names key, null or not.
func (o *obj) present(key string) bool { return o.n.has(key) }

// child opens a nested mapping.
func (o *obj) child(key string) *obj { return o.d.object(o.field(key), o.sub(key)) }

func (o *obj) errAt(n *node, key, msg, hint string) {
	o.d.bad[o.sub(key)] = true
	o.d.add(SeverityError, n.line, n.col, o.sub(key), msg, hint)
}

func (o *obj) warnAt(n *node, key, msg, hint string) {
	o.d.add(SeverityWarning, n.line, n.col, o.sub(key), msg, hint)
}

func isNull(n *node) bool { return n != nil && n.kind == nodeScalar && n.typ == scalarNull }

// str reads a string. A null leaves dst unchanged when nullable, and is an error otherwise.
func (o *obj) str(key string, dst *string, nullable bool) bool {
	n := o.field(key)
	if n == nil || (nullable && isNull(n)) {
		return false
	}
	if n.kind != nodeScalar || n.typ != scalarString {
		o.errAt(n, key, "want a string, found "+n.describe(), quoteHint(n))
		return false
	}
	*dst = n.text
	return true
}

func quoteHint(n *node) string {
	if n.kind == nodeScalar && n.typ != scalarNull {
		return fmt.Sprintf("quote it: %q", n.text)
	}
	return ""
}

// strPtr reads an optional string; null and absent both leave nil.
func (o *obj) strPtr(key string, dst **string) {
	var s string
	if o.str(key, &s, true) {
		*dst = &s
	}
}

// intMode says how lenient an integer field is.
type intMode uint8

const (
	intExact  intMode = iota // an integer, or a float with no fraction
	intPython                // Python int(): floats truncate, numeric strings parse (with a warning)
)

func (o *obj) intv(key string, mode intMode) (int64, *node, bool) {
	n := o.field(key)
	if n == nil || isNull(n) {
		return 0, n, false
	}
	if n.kind != nodeScalar {
		o.errAt(n, key, "want an integer, found "+n.describe(), "")
		return 0, n, false
	}
	switch n.typ {
	case scalarInt:
		if n.overflow {
			o.errAt(n, key, "integer "+n.text+" is out of range", "")
			return 0, n, false
		}
		return n.i, n, true
	case scalarFloat:
		if math.IsNaN(n.f) || math.IsInf(n.f, 0) || math.Abs(n.f) >= 0x1p63 {
			o.errAt(n, key, "want an integer, found "+n.describe(), "")
			return 0, n, false
		}
		if n.f == math.Trunc(n.f) {
			return int64(n.f), n, true
		}
		if mode == intPython {
			o.warnAt(n, key, fmt.Sprintf("%s is truncated to %d", n.text, int64(n.f)), "write a whole number")
			return int64(n.f), n, true
		}
	case scalarString:
		if mode == intPython {
			if v, err := strconv.ParseInt(strings.TrimSpace(n.text), 10, 64); err == nil {
				o.warnAt(n, key, "a quoted number is read as the integer "+strconv.FormatInt(v, 10),
					"write it without quotes")
				return v, n, true
			}
		}
	}
	o.errAt(n, key, "want an integer, found "+n.describe(), "")
	return 0, n, false
}

// intPtr reads an optional integer (intExact) that must be at least floor.
func (o *obj) intPtr(key string, dst **int64, floor int64) {
	v, n, ok := o.intv(key, intExact)
	if !ok {
		return
	}
	if v < floor {
		o.errAt(n, key, fmt.Sprintf("must be at least %d, found %d", floor, v), "")
		return
	}
	*dst = &v
}

// boolMode says how a boolean field treats values that are not booleans.
type boolMode uint8

const (
	boolStrict   boolMode = iota // a JSON boolean only: the string "false" is an error
	boolPydantic                 // pydantic's lax booleans: "yes", "off", 0, 1 are read, with a warning
	boolTruthy                   // Python bool(): anything is read by its truthiness, with a warning
)

var pydanticBools = map[string]bool{
	"0": false, "off": false, "f": false, "false": false, "n": false, "no": false,
	"1": true, "on": true, "t": true, "true": true, "y": true, "yes": true,
}

func (o *obj) boolv(key string, mode boolMode) (bool, bool) {
	n := o.field(key)
	if n == nil {
		return false, false
	}
	if n.kind == nodeScalar && n.typ == scalarBool {
		return n.b, true
	}
	switch mode {
	case boolPydantic:
		if n.kind == nodeScalar {
			if n.typ == scalarString {
				if b, ok := pydanticBools[strings.ToLower(n.text)]; ok {
					o.warnAt(n, key, fmt.Sprintf("%s is read as %t", n.describe(), b),
						"write "+strconv.FormatBool(b)+" without quotes")
					return b, true
				}
			}
			if n.typ == scalarInt && (n.i == 0 || n.i == 1) {
				return n.i == 1, true
			}
		}
	case boolTruthy:
		b := truthy(n)
		o.warnAt(n, key, fmt.Sprintf("%s is read by its truthiness, as %t", n.describe(), b),
			"write true or false")
		return b, true
	}
	hint := "write true or false"
	if n.kind == nodeScalar && n.typ == scalarString {
		hint = "write true or false without quotes: a careless reader turns any non-empty string into true"
	}
	o.errAt(n, key, "want a boolean, found "+n.describe(), hint)
	return false, false
}

func truthy(n *node) bool {
	switch n.kind {
	case nodeMap:
		return len(n.keys) > 0
	case nodeSeq:
		return len(n.items) > 0
	}
	switch n.typ {
	case scalarNull:
		return false
	case scalarBool:
		return n.b
	case scalarInt:
		return n.i != 0 || n.overflow
	case scalarFloat:
		return n.f != 0
	default:
		return n.text != ""
	}
}

func (o *obj) boolPtr(key string, dst **bool, mode boolMode) {
	if b, ok := o.boolv(key, mode); ok {
		*dst = &b
	}
}

// floatPtr reads an optional number that must be finite and, when positive is set, > 0.
func (o *obj) floatPtr(key string, dst **float64, positive bool) {
	n := o.field(key)
	if n == nil || isNull(n) {
		return
	}
	var f float64
	switch {
	case n.kind == nodeScalar && n.typ == scalarInt && !n.overflow:
		f = float64(n.i)
	case n.kind == nodeScalar && n.typ == scalarFloat:
		f = n.f
	default:
		o.errAt(n, key, "want a number, found "+n.describe(), "")
		return
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		o.errAt(n, key, "must be a finite number, found "+n.text, "")
		return
	}
	if positive && f <= 0 {
		o.errAt(n, key, "must be greater than 0, found "+n.text, "leave it out to turn it off")
		return
	}
	*dst = &f
}

// Size is a byte count read from a config file, with the text it was written as.
type Size struct {
	Bytes int64  `json:"bytes"`
	Text  string `json:"text,omitempty"` // the string form as written; empty for a plain integer
}

// sizePtr reads a size with ParseSize, requiring at least floor bytes.
func (o *obj) sizePtr(key string, dst **Size, strict bool, floor int64) {
	n := o.field(key)
	if n == nil || isNull(n) {
		return
	}
	if n.kind != nodeScalar {
		o.errAt(n, key, "want a byte count or a size string such as \"4GiB\", found "+n.describe(), "")
		return
	}
	if n.typ == scalarInt && n.overflow {
		o.errAt(n, key, "integer "+n.text+" is out of range", "")
		return
	}
	v, err := ParseSize(n.value(), strict)
	if err != nil {
		msg, hint := err.Error(), ""
		if se := (*SizeError)(nil); errors.As(err, &se) {
			msg, hint = se.Value+": "+se.Reason, se.Hint
		}
		o.errAt(n, key, msg, hint)
		return
	}
	if v < floor {
		o.errAt(n, key, fmt.Sprintf("must be at least %d bytes, found %d", floor, v), "")
		return
	}
	s := &Size{Bytes: v}
	if n.typ == scalarString {
		s.Text = n.text
	}
	*dst = s
}

// rest reports the keys of the mapping that no field read.
func (o *obj) rest(sev Severity, what string) {
	if o.n == nil {
		return
	}
	var known []string
	for k := range o.used {
		known = append(known, k)
	}
	sort.Strings(known)
	for _, k := range o.n.keys {
		if o.used[k.text] {
			continue
		}
		hint := ""
		if s := suggest(k.text, known); s != "" {
			hint = "did you mean " + s + "?"
		}
		o.d.add(sev, k.line, k.col, o.sub(k.text), "unknown key "+strconv.Quote(k.text)+what, hint)
	}
}

// suggest returns the known key closest to k, if it is close enough to be a likely typo.
func suggest(k string, known []string) string {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "-", "_")) }
	best, bestD := "", 3
	for _, c := range known {
		if norm(c) == norm(k) {
			return c
		}
		if d := editDistance(k, c); d < bestD {
			best, bestD = c, d
		}
	}
	if len(k) <= 3 && bestD > 1 {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
