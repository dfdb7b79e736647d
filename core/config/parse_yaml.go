package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
)

const maxDepth = 200

var yamlLineRE = regexp.MustCompile(`line (\d+)(?:, column (\d+))?: ?`)

// parseYAML reads one YAML document into a tree. It returns nil after recording an error
// when the text is not a single well-formed document.
func parseYAML(d *dec, data []byte) (root *node) {
	defer func() {
		if r := recover(); r != nil {
			line, col := firstBadByte(data)
			d.add(SeverityError, line, col, "", fmt.Sprintf("cannot parse YAML: %v", r), "")
			root = nil
		}
	}()
	dc := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dc.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.add(SeverityError, 1, 1, "", "the file is empty", "")
			return nil
		}
		d.yamlError(err, data)
		return nil
	}
	var more yaml.Node
	if err := dc.Decode(&more); err == nil {
		d.add(SeverityError, more.Line, more.Column, "", "the file holds more than one YAML document",
			"keep one document; TensorRT-LLM reads exactly one")
	} else if !errors.Is(err, io.EOF) {
		d.yamlError(err, data)
		return nil
	}
	if len(doc.Content) == 0 {
		d.add(SeverityError, 1, 1, "", "the file is empty", "")
		return nil
	}
	c := yamlConv{d: d, memo: map[*yaml.Node]*node{}}
	return c.conv(doc.Content[0], "", 0)
}

func (d *dec) yamlError(err error, data []byte) {
	msg := err.Error()
	if len(msg) > 6 && msg[:6] == "yaml: " {
		msg = msg[6:]
	}
	line, col := 0, 0
	if m := yamlLineRE.FindStringSubmatchIndex(msg); m != nil {
		line, _ = strconv.Atoi(msg[m[2]:m[3]])
		if m[4] >= 0 {
			col, _ = strconv.Atoi(msg[m[4]:m[5]])
		}
		msg = msg[:m[0]] + msg[m[1]:]
	}
	if line == 0 {
		line, col = firstBadByte(data)
	}
	d.add(SeverityError, line, max(col, 1), "", "cannot parse YAML: "+msg, "")
}

// firstBadByte locates the first byte that is not valid UTF-8 or is a control character
// YAML forbids, falling back to the start of the file.
func firstBadByte(data []byte) (line, col int) {
	line, col = 1, 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return line, col
		}
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' || r == 0x7f {
			return line, col
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		i += size
	}
	return 1, 1
}

type yamlConv struct {
	d    *dec
	memo map[*yaml.Node]*node
}

func (c *yamlConv) conv(y *yaml.Node, path string, depth int) *node {
	if depth > maxDepth {
		c.d.add(SeverityError, y.Line, y.Column, path, "nesting is too deep", "")
		return &node{kind: nodeScalar, typ: scalarNull, line: y.Line, col: y.Column}
	}
	if y.Kind == yaml.AliasNode && y.Alias != nil {
		return c.conv(y.Alias, path, depth+1)
	}
	if n, ok := c.memo[y]; ok {
		return n
	}
	n := &node{line: y.Line, col: y.Column}
	c.memo[y] = n
	switch y.Kind {
	case yaml.MappingNode:
		n.kind = nodeMap
		c.mapping(n, y, path, depth)
	case yaml.SequenceNode:
		n.kind = nodeSeq
		for i, it := range y.Content {
			n.items = append(n.items, c.conv(it, fmt.Sprintf("%s[%d]", path, i), depth+1))
		}
	case yaml.DocumentNode:
		if len(y.Content) > 0 {
			return c.conv(y.Content[0], path, depth+1)
		}
		n.typ = scalarNull
	default:
		c.scalar(n, y)
	}
	return n
}

func (c *yamlConv) scalar(n *node, y *yaml.Node) {
	n.kind = nodeScalar
	if y.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		n.typ, n.text = scalarString, y.Value
		return
	}
	if y.Style&yaml.TaggedStyle != 0 {
		switch y.ShortTag() {
		case "!!str":
			n.typ, n.text = scalarString, y.Value
			return
		case "!!null":
			n.typ, n.text = scalarNull, y.Value
			return
		}
	}
	resolvePlain(n, y.Value)
}

func (c *yamlConv) mapping(n *node, y *yaml.Node, path string, depth int) {
	var merges []*node
	for i := 0; i+1 < len(y.Content); i += 2 {
		ky, vy := y.Content[i], y.Content[i+1]
		if ky.Kind == yaml.AliasNode && ky.Alias != nil {
			ky = ky.Alias
		}
		if ky.Kind != yaml.ScalarNode {
			c.d.add(SeverityError, ky.Line, ky.Column, path, "a key must be a plain value, not "+yamlKindName(ky), "")
			continue
		}
		if ky.Value == "<<" && (ky.Tag == "!!merge" || ky.Style == 0) {
			merges = append(merges, c.conv(vy, path, depth+1))
			continue
		}
		k := &node{kind: nodeScalar, typ: scalarString, text: ky.Value, line: ky.Line, col: ky.Column}
		v := c.conv(vy, joinPath(path, ky.Value), depth+1)
		c.d.putKey(n, k, v, path)
	}
	// Merged entries come after the explicit ones and never replace them.
	for _, m := range merges {
		var srcs []*node
		if m.kind == nodeSeq {
			srcs = m.items
		} else {
			srcs = []*node{m}
		}
		for _, s := range srcs {
			if s.kind != nodeMap {
				c.d.add(SeverityError, s.line, s.col, path, "a merge key needs a mapping, not "+s.describe(), "")
				continue
			}
			for j, k := range s.keys {
				if !n.has(k.text) {
					n.keys = append(n.keys, k)
					n.vals = append(n.vals, s.vals[j])
				}
			}
		}
	}
}

func yamlKindName(y *yaml.Node) string {
	switch y.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "a value"
}

// putKey adds a key to a map node; a repeated key replaces the earlier value, as both
// Python readers do, with a warning.
func (d *dec) putKey(n, k, v *node, path string) {
	for i, old := range n.keys {
		if old.text == k.text {
			d.add(SeverityWarning, k.line, k.col, joinPath(path, k.text),
				fmt.Sprintf("duplicate key; this value replaces the one on line %d", old.line),
				"remove one of the two")
			n.keys[i], n.vals[i] = k, v
			return
		}
	}
	n.keys = append(n.keys, k)
	n.vals = append(n.vals, v)
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
