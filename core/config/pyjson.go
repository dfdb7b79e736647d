package config

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// pyJSON writes JSON the way Python's json.dump(indent=2) does: ", " is replaced by "," at
// line ends, ": " separates keys, non-ASCII is escaped as \uXXXX, and floats use repr.
type pyJSON struct {
	b        bytes.Buffer
	sortKeys bool
}

// kv is one entry of an ordered object.
type kv struct {
	k string
	v any
}

// pyNumber is a number kept as written (an integer too large for int64).
type pyNumber string

func (w *pyJSON) value(v any, indent int) {
	switch x := v.(type) {
	case nil:
		w.b.WriteString("null")
	case bool:
		w.b.WriteString(strconv.FormatBool(x))
	case int64:
		w.b.WriteString(strconv.FormatInt(x, 10))
	case int:
		w.b.WriteString(strconv.Itoa(x))
	case float64:
		w.b.WriteString(formatPyFloat(x))
	case pyNumber:
		w.b.WriteString(string(x))
	case string:
		w.str(x)
	case []kv:
		w.object(x, indent)
	case map[string]any:
		entries := make([]kv, 0, len(x))
		for k, v := range x {
			entries = append(entries, kv{k, v})
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].k < entries[j].k })
		w.object(entries, indent)
	case []any:
		if len(x) == 0 {
			w.b.WriteString("[]")
			return
		}
		w.b.WriteString("[")
		for i, it := range x {
			if i > 0 {
				w.b.WriteString(",")
			}
			w.newline(indent + 1)
			w.value(it, indent+1)
		}
		w.newline(indent)
		w.b.WriteString("]")
	default:
		w.str(fmt.Sprint(x))
	}
}

func (w *pyJSON) object(entries []kv, indent int) {
	if len(entries) == 0 {
		w.b.WriteString("{}")
		return
	}
	if w.sortKeys {
		entries = append([]kv(nil), entries...)
		sort.SliceStable(entries, func(i, j int) bool { return codePointLess(entries[i].k, entries[j].k) })
	}
	w.b.WriteString("{")
	for i, e := range entries {
		if i > 0 {
			w.b.WriteString(",")
		}
		w.newline(indent + 1)
		w.str(e.k)
		w.b.WriteString(": ")
		w.value(e.v, indent+1)
	}
	w.newline(indent)
	w.b.WriteString("}")
}

// codePointLess orders strings by code point, as Python sorts str keys.
func codePointLess(a, b string) bool {
	ra, rb := []rune(a), []rune(b)
	for i := 0; i < len(ra) && i < len(rb); i++ {
		if ra[i] != rb[i] {
			return ra[i] < rb[i]
		}
	}
	return len(ra) < len(rb)
}

func (w *pyJSON) newline(indent int) {
	w.b.WriteByte('\n')
	for range indent {
		w.b.WriteString("  ")
	}
}

func (w *pyJSON) str(s string) {
	w.b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			w.b.WriteString(`\"`)
		case r == '\\':
			w.b.WriteString(`\\`)
		case r == '\n':
			w.b.WriteString(`\n`)
		case r == '\r':
			w.b.WriteString(`\r`)
		case r == '\t':
			w.b.WriteString(`\t`)
		case r == '\b':
			w.b.WriteString(`\b`)
		case r == '\f':
			w.b.WriteString(`\f`)
		case r >= 0x20 && r <= 0x7e:
			w.b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&w.b, `\u%04x\u%04x`, r1, r2)
		case r == utf8.RuneError:
			w.b.WriteString(`\ufffd`)
		default:
			fmt.Fprintf(&w.b, `\u%04x`, r)
		}
	}
	w.b.WriteByte('"')
}

// treeValue turns a parsed value back into plain Go values for pyJSON.
func treeValue(n *node) any {
	switch n.kind {
	case nodeMap:
		m := make(map[string]any, len(n.keys))
		for i, k := range n.keys {
			m[k.text] = treeValue(n.vals[i])
		}
		return m
	case nodeSeq:
		s := make([]any, len(n.items))
		for i, it := range n.items {
			s[i] = treeValue(it)
		}
		return s
	}
	switch n.typ {
	case scalarInt:
		if n.overflow {
			return pyNumber(n.text)
		}
		return n.i
	case scalarFloat:
		return n.f
	case scalarBool:
		return n.b
	case scalarNull:
		return nil
	}
	return n.text
}
