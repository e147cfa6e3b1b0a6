package filesource

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Problem is a mistake in a file, located: the file, the line and, for a
// service's mistake, the service and field.
type Problem struct {
	File    string
	Line    int
	Service string
	Field   string
	Err     error
}

func (p *Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	if p.Service != "" {
		fmt.Fprintf(&b, ": service %q", p.Service)
	}
	if p.Field != "" {
		fmt.Fprintf(&b, ": %s", p.Field)
	}
	fmt.Fprintf(&b, ": %v", p.Err)
	return b.String()
}

func (p *Problem) Unwrap() error { return p.Err }

// Parsed is a file that parsed: its services, and the mistakes of those
// that could not be converted.
type Parsed struct {
	File string
	// Services are the converted services, in file order.
	Services []servicelb.Service
	// Bad maps the name of each service left out to its problems.
	Bad map[string]error
	// Stated says whether the file has a services key (services: [] is an
	// empty set, stated), rather than being empty or having none.
	Stated bool

	root  *yaml.Node
	index map[string]int // service name to its position in the file
}

var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// Parse parses a YAML or JSON document. A syntax error, an unknown field or
// a value of the wrong type fails the whole file, as a *Problem (or several
// joined) with its line and field. A service with a value that does not
// parse (an address, a prefix, a duration) is left out and its problems
// recorded in Bad; servicelb's own rules are checked when the services are
// applied (see Locate).
func Parse(file string, data []byte) (*Parsed, error) {
	p := &Parsed{File: file, Bad: map[string]error{}, index: map[string]int{}, root: &yaml.Node{}}
	if err := yaml.Unmarshal(data, p.root); err != nil {
		return nil, p.yamlProblems(err)
	}
	if p.root.Kind != yaml.DocumentNode || len(p.root.Content) == 0 {
		return p, nil // an empty document: no services
	}
	doc := p.root.Content[0]
	var c checker
	c.check(doc, reflect.TypeFor[File](), "")
	if len(c.shape) > 0 {
		var errs []error
		for _, e := range c.shape {
			errs = append(errs, &Problem{File: file, Line: e.line, Field: e.field, Err: errors.New(e.msg)})
		}
		return nil, errors.Join(errs...)
	}
	var services []*yaml.Node
	if n := child(doc, segment{key: "services", index: -1}); n != nil {
		services, p.Stated = n.Content, true
	}
	bad := map[int][]error{}
	for _, fe := range c.bad {
		var i int
		var rest string
		if _, err := fmt.Sscanf(fe.field, "services[%d]", &i); err == nil {
			_, rest, _ = strings.Cut(fe.field, "].")
		}
		bad[i] = append(bad[i], &fieldError{rest, fe.err})
	}
	for i, n := range services {
		var svc servicelb.Service
		err := decode(n, &svc)
		name := svc.Name
		if err != nil {
			name = nameOf(n)
		}
		path := fmt.Sprintf("services[%d]", i)
		if j, dup := p.index[name]; dup {
			p.Bad[name] = errors.Join(p.Bad[name], &Problem{File: file, Line: p.line(path + ".name"), Service: name,
				Field: "name", Err: fmt.Errorf("duplicate service name, also services[%d]", j)})
			continue
		}
		p.index[name] = i
		if errs := bad[i]; len(errs) > 0 {
			p.Bad[name] = p.locateAll(name, errors.Join(errs...))
			continue
		}
		if err != nil {
			p.Bad[name] = p.locateAll(name, err)
			continue
		}
		p.Services = append(p.Services, svc)
	}
	return p, nil
}

// decode reads a service's node through servicelb's JSON encoding, so
// that the file means what the Go API does.
func decode(n *yaml.Node, svc *servicelb.Service) error {
	var v any
	if err := n.Decode(&v); err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, svc)
}

// nameOf returns the name a service's node gives, or "".
func nameOf(n *yaml.Node) string {
	if v := child(n, segment{key: "name", index: -1}); v != nil {
		return v.Value
	}
	return ""
}

// yamlProblems turns a yaml error into problems with lines.
func (p *Parsed) yamlProblems(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var errs []error
		for _, m := range te.Errors {
			errs = append(errs, p.lineProblem(m))
		}
		return errors.Join(errs...)
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if msg == "EOF" {
		return nil
	}
	return p.lineProblem(msg)
}

func (p *Parsed) lineProblem(msg string) error {
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return &Problem{File: p.File, Line: n, Err: errors.New(m[2])}
	}
	return &Problem{File: p.File, Err: errors.New(msg)}
}

// Locate turns the errors servicelb returned for the file's services (each
// a *servicelb.ValidationError, possibly joined) into *Problem values with
// lines. Errors it cannot place are kept as they are.
func (p *Parsed) Locate(err error) error {
	var errs []error
	for _, e := range leaves(err) {
		var ve *servicelb.ValidationError
		if !errors.As(e, &ve) {
			errs = append(errs, e)
			continue
		}
		i, ok := p.index[ve.Service]
		if !ok {
			errs = append(errs, e)
			continue
		}
		path := fmt.Sprintf("services[%d].%s", i, ve.Field)
		pr := &Problem{File: p.File, Line: p.line(path), Service: ve.Service, Field: ve.Field, Err: ve.Err}
		if ve.Value != "" {
			pr.Err = fmt.Errorf("%s: %w", ve.Value, ve.Err)
		}
		errs = append(errs, pr)
	}
	return errors.Join(errs...)
}

// ByService groups the errors Locate returns by service name.
func ByService(err error) map[string]error {
	out := map[string]error{}
	for _, e := range leaves(err) {
		var pr *Problem
		var ve *servicelb.ValidationError
		name := ""
		switch {
		case errors.As(e, &pr):
			name = pr.Service
		case errors.As(e, &ve):
			name = ve.Service
		}
		out[name] = errors.Join(out[name], e)
	}
	return out
}

func (p *Parsed) locateAll(svc string, err error) error {
	i := p.index[svc]
	var errs []error
	for _, e := range leaves(err) {
		var fe *fieldError
		if errors.As(e, &fe) {
			path := fmt.Sprintf("services[%d].%s", i, fe.field)
			errs = append(errs, &Problem{File: p.File, Line: p.line(path), Service: svc, Field: fe.field, Err: fe.err})
			continue
		}
		errs = append(errs, &Problem{File: p.File, Line: p.line(fmt.Sprintf("services[%d]", i)), Service: svc, Err: e})
	}
	return errors.Join(errs...)
}

// leaves flattens joined errors.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}
