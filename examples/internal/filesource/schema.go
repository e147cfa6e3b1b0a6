// Package filesource reads services from a YAML or JSON file, reports
// every mistake with the file, line and field, and feeds the services to a
// servicelb.Runner, watching the file and applying only what changed.
//
// # Schema
//
// A file holds one document with a list of services, in servicelb's own
// encoding (its JSON field names, its defaults, durations as strings such
// as "3h"): a servicelb.Service written by the Go API's json.Marshal reads
// back the same, and what a file leaves out means what the Go API's zero
// value means (servicelb.WithDefaults; an endpoint whose conditions are
// left out is ready, as a Kubernetes EndpointSlice's is). JSON is the
// same document in JSON syntax.
//
//	services:
//	  - name: default/web            # unique key, required
//	    clusterIPs: [10.96.0.10]     # at most one per family
//	    externalIPs: []              # more addresses the ports are served on
//	    loadBalancerIPs: []          # captured on the node
//	    proxiedLoadBalancerIPs: []   # a load balancer that proxies: not captured
//	    ports:                       # at least one
//	      - name: http               # may be empty for a single port
//	        protocol: TCP            # TCP (default), UDP or SCTP
//	        port: 80
//	        nodePort: 30080          # optional
//	        targetPort: 8080         # default: port
//	    internalTrafficPolicy: Cluster   # (default) or Local
//	    externalTrafficPolicy: Cluster   # (default) or Local
//	    affinity: {clientIP: true, timeout: 3h}   # timeout default 3h
//	    sourceRanges: [192.0.2.0/24]
//	    healthCheckNodePort: 0
//	    scheduler: ""                # hint: rr, wrr, lc, sh, mh, random, ...
//	    endpoints:
//	      - addr: 10.100.1.2
//	        ports: {http: 8080}      # per port name; default: targetPort
//	        onlyNamedPorts: false    # true: no traffic for other ports
//	        ready: true              # default true
//	        serving: true            # default: ready
//	        terminating: false
//	        nodeName: node-a
//	        zone: zone-a
//	        hints: {forZones: [zone-a], forNodes: []}
//	        weight: 1                # default 1; 0 drains
//
// Unknown fields and values of the wrong type fail the whole file, each
// reported with its line and field; a service with a value that does not
// parse (an address, a prefix, a duration) is left out with its problems,
// and the others are applied. See examples/cmd/kproxy/services.yaml for a
// commented example.
package filesource

import (
	"encoding"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// File is the document.
type File struct {
	Services []servicelb.Service `json:"services"`
}

// durationText marks, in a wire type, a duration written as a string.
type durationText struct{}

// affinityWire is servicelb.SessionAffinity as its JSON encoding writes it.
type affinityWire struct {
	ClientIP bool         `json:"clientIP"`
	Timeout  durationText `json:"timeout"`
}

// wireTypes are the model's types whose encoding is not their Go shape.
var wireTypes = map[reflect.Type]reflect.Type{
	reflect.TypeFor[servicelb.SessionAffinity](): reflect.TypeFor[affinityWire](),
}

// fieldError is a value at a field path of one service that does not
// parse, such as "endpoints[2].addr".
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// shapeError is a value of the wrong shape or an unknown field at a node.
type shapeError struct {
	line  int
	field string
	msg   string
}

// checker walks a document's nodes along the Go type they must decode
// into, finding unknown fields, values of the wrong type and values that
// do not parse, each with its line.
type checker struct {
	shape []shapeError
	bad   []*fieldError
}

// check walks n as a value of type t at path (relative to the service, or
// the document for the top level).
func (c *checker) check(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if w, ok := wireTypes[t]; ok {
		t = w
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // as JSON's null: the zero value
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[durationText]():
		if c.scalar(n, "!!str", path, "a duration such as \"3h\"") {
			if _, err := time.ParseDuration(n.Value); err != nil {
				c.bad = append(c.bad, &fieldError{path, err})
			}
		}
	case reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()):
		if c.scalar(n, "!!str", path, "a string") {
			v := reflect.New(t).Interface().(encoding.TextUnmarshaler)
			if err := v.UnmarshalText([]byte(n.Value)); err != nil {
				c.bad = append(c.bad, &fieldError{path, err})
			}
		}
	case t.Kind() == reflect.Struct:
		if !c.kind(n, yaml.MappingNode, path, "a mapping") {
			return
		}
		fields := jsonFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			f, ok := fields[k.Value]
			if !ok {
				c.shape = append(c.shape, shapeError{k.Line, join(path, k.Value), unknownField(k.Value, fields)})
				continue
			}
			c.check(v, f, join(path, k.Value))
		}
	case t.Kind() == reflect.Slice:
		if !c.kind(n, yaml.SequenceNode, path, "a list") {
			return
		}
		for i, e := range n.Content {
			c.check(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case t.Kind() == reflect.Map:
		if !c.kind(n, yaml.MappingNode, path, "a mapping") {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := fmt.Sprintf("%s[%q]", path, n.Content[i].Value)
			if c.scalar(n.Content[i], "!!str", k, "a name (quote a key that looks like a number)") {
				c.check(n.Content[i+1], t.Elem(), k)
			}
		}
	case t.Kind() == reflect.String:
		c.scalar(n, "!!str", path, "a string (quote a value that looks like a number)")
	case t.Kind() == reflect.Bool:
		c.scalar(n, "!!bool", path, "true or false")
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		max := uint64(math.MaxUint64) >> (64 - t.Bits())
		want := fmt.Sprintf("an integer from 0 to %d", max)
		if c.scalar(n, "!!int", path, want) {
			if v, err := strconv.ParseUint(n.Value, 0, t.Bits()); err != nil || v > max {
				c.shape = append(c.shape, shapeError{n.Line, path, fmt.Sprintf("want %s, got %s", want, n.Value)})
			}
		}
	default:
		c.shape = append(c.shape, shapeError{n.Line, path, fmt.Sprintf("no file form for %s", t)})
	}
}

func (c *checker) kind(n *yaml.Node, k yaml.Kind, path, want string) bool {
	if n.Kind == k {
		return true
	}
	c.shape = append(c.shape, shapeError{n.Line, path, fmt.Sprintf("want %s, got %s", want, describe(n))})
	return false
}

func (c *checker) scalar(n *yaml.Node, tag, path, want string) bool {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == tag {
		return true
	}
	c.shape = append(c.shape, shapeError{n.Line, path, fmt.Sprintf("want %s, got %s", want, describe(n))})
	return false
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// jsonFields maps the JSON names of a struct's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// unknownField says a key is no field, and which it may have meant.
func unknownField(key string, fields map[string]reflect.Type) string {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return fmt.Sprintf("unknown field %q (did you mean %q?)", key, name)
		}
	}
	return fmt.Sprintf("unknown field %q", key)
}
