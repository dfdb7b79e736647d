package config

import (
	"math"
	"strconv"
	"strings"
)

// The parsers for YAML and JSON both produce this small tree, so the schemas are decoded once
// for either syntax and every value keeps the place it came from.

type nodeKind uint8

const (
	nodeScalar nodeKind = iota
	nodeMap
	nodeSeq
)

type scalarType uint8

const (
	scalarNull scalarType = iota
	scalarBool
	scalarInt
	scalarFloat
	scalarString
)

type node struct {
	kind      nodeKind
	line, col int

	typ      scalarType
	text     string // the scalar as written (a string's decoded value)
	b        bool
	i        int64
	f        float64
	overflow bool // an integer literal beyond int64

	keys  []*node // map keys (scalars), in file order, duplicates already resolved
	vals  []*node
	items []*node
}

func (n *node) get(key string) (k, v *node) {
	if n == nil || n.kind != nodeMap {
		return nil, nil
	}
	for i, kn := range n.keys {
		if kn.text == key {
			return kn, n.vals[i]
		}
	}
	return nil, nil
}

func (n *node) has(key string) bool {
	k, _ := n.get(key)
	return k != nil
}

// describe names a node's type the way a reader of the file would.
func (n *node) describe() string {
	if n == nil {
		return "nothing"
	}
	switch n.kind {
	case nodeMap:
		return "a mapping"
	case nodeSeq:
		return "a list"
	}
	switch n.typ {
	case scalarNull:
		return "null"
	case scalarBool:
		return "the boolean " + strconv.FormatBool(n.b)
	case scalarInt:
		return "the integer " + n.text
	case scalarFloat:
		return "the number " + n.text
	default:
		return "the string " + strconv.Quote(n.text)
	}
}

// value returns the scalar as a Go value for ParseSize.
func (n *node) value() any {
	switch n.typ {
	case scalarNull:
		return nil
	case scalarBool:
		return n.b
	case scalarInt:
		return n.i
	case scalarFloat:
		return n.f
	default:
		return n.text
	}
}

// resolvePlain types an unquoted YAML scalar as PyYAML (YAML 1.1) does, since that is what
// TensorRT-LLM reads its YAML with: yes/no/on/off are booleans, 0o17 and 017 are octal, and a
// float needs a point (1e5 is a string).
func resolvePlain(n *node, s string) {
	n.text = s
	switch s {
	case "", "~", "null", "Null", "NULL":
		n.typ = scalarNull
		return
	case "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON":
		n.typ, n.b = scalarBool, true
		return
	case "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF":
		n.typ, n.b = scalarBool, false
		return
	case ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF":
		n.typ, n.f = scalarFloat, math.Inf(1)
		return
	case "-.inf", "-.Inf", "-.INF":
		n.typ, n.f = scalarFloat, math.Inf(-1)
		return
	case ".nan", ".NaN", ".NAN":
		n.typ, n.f = scalarFloat, math.NaN()
		return
	}
	if isYAMLInt(s) {
		n.typ = scalarInt
		v, ok := parseYAMLInt(s)
		n.i, n.overflow = v, !ok
		return
	}
	if isYAMLFloat(s) {
		f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
		if err == nil || math.IsInf(f, 0) {
			n.typ, n.f = scalarFloat, f
			return
		}
	}
	n.typ = scalarString
}

func isYAMLInt(s string) bool {
	t := strings.TrimLeft(s, "+-")
	if len(s)-len(t) > 1 || t == "" {
		return false
	}
	switch {
	case strings.HasPrefix(t, "0b"):
		return allIn(t[2:], "01_") && len(t) > 2
	case strings.HasPrefix(t, "0x"):
		return allIn(t[2:], "0123456789abcdefABCDEF_") && len(t) > 2
	case strings.HasPrefix(t, "0o"):
		return allIn(t[2:], "01234567_") && len(t) > 2
	case t == "0":
		return true
	case t[0] == '0':
		return allIn(t[1:], "01234567_")
	default:
		return t[0] >= '1' && t[0] <= '9' && allIn(t, "0123456789_")
	}
}

func parseYAMLInt(s string) (int64, bool) {
	neg := strings.HasPrefix(s, "-")
	t := strings.ReplaceAll(strings.TrimLeft(s, "+-"), "_", "")
	base := 10
	switch {
	case strings.HasPrefix(t, "0b"):
		base, t = 2, t[2:]
	case strings.HasPrefix(t, "0x"):
		base, t = 16, t[2:]
	case strings.HasPrefix(t, "0o"):
		base, t = 8, t[2:]
	case len(t) > 1 && t[0] == '0':
		base, t = 8, t[1:]
	}
	if t == "" {
		return 0, true
	}
	u, err := strconv.ParseUint(t, base, 64)
	if err != nil {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

func isYAMLFloat(s string) bool {
	t := strings.TrimLeft(s, "+-")
	if len(s)-len(t) > 1 || t == "" {
		return false
	}
	mant, exp, hasExp := strings.Cut(t, "e")
	if !hasExp {
		mant, exp, hasExp = strings.Cut(t, "E")
	}
	intPart, frac, hasDot := strings.Cut(mant, ".")
	if !hasDot || strings.Contains(frac, ".") {
		return false
	}
	if !allIn(intPart, "0123456789_") || !allIn(frac, "0123456789_") {
		return false
	}
	if intPart == "" && frac == "" {
		return false
	}
	if hasExp {
		if len(exp) < 2 || (exp[0] != '+' && exp[0] != '-') || !allIn(exp[1:], "0123456789") {
			return false
		}
	}
	return true
}

func allIn(s, set string) bool {
	for i := 0; i < len(s); i++ {
		if !strings.ContainsRune(set, rune(s[i])) {
			return false
		}
	}
	return true
}
