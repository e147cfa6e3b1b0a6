package filesource

import (
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// line returns the line of the node at path, such as
// `services[2].endpoints[0].ports["http"]`, or of the deepest node on the
// way that exists; 0 when the document is empty.
func (p *Parsed) line(path string) int {
	n := p.root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, seg := range splitPath(path) {
		next := child(n, seg)
		if next == nil {
			break
		}
		n, line = next, next.Line
	}
	return line
}

// segment is one step of a path: a mapping key or a sequence index.
type segment struct {
	key   string
	index int // -1 for a key
}

// splitPath splits `a[1].b["k"]` into a, [1], b, ["k"].
func splitPath(path string) []segment {
	var out []segment
	for path != "" {
		switch {
		case strings.HasPrefix(path, "."):
			path = path[1:]
		case strings.HasPrefix(path, "[\""):
			end := strings.Index(path, "\"]")
			if end < 0 {
				return out
			}
			out = append(out, segment{key: path[2:end], index: -1})
			path = path[end+2:]
		case strings.HasPrefix(path, "["):
			end := strings.IndexByte(path, ']')
			if end < 0 {
				return out
			}
			i, err := strconv.Atoi(path[1:end])
			if err != nil {
				return out
			}
			out = append(out, segment{index: i})
			path = path[end+1:]
		default:
			end := strings.IndexAny(path, ".[")
			if end < 0 {
				end = len(path)
			}
			out = append(out, segment{key: path[:end], index: -1})
			path = path[end:]
		}
	}
	return out
}

func child(n *yaml.Node, s segment) *yaml.Node {
	switch {
	case s.index >= 0 && n.Kind == yaml.SequenceNode:
		if s.index < len(n.Content) {
			return n.Content[s.index]
		}
	case s.index < 0 && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == s.key {
				// A scalar's value is on the key's line; point at the key
				// for collections, whose content starts below it.
				if v := n.Content[i+1]; v.Kind == yaml.ScalarNode {
					return v
				}
				return &yaml.Node{Kind: n.Content[i+1].Kind, Content: n.Content[i+1].Content, Line: n.Content[i].Line}
			}
		}
	}
	return nil
}
