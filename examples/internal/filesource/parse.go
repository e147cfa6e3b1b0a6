package filesource

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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

	root  *yaml.Node
	index map[string]int // service name to its position in the file
}

var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// Parse parses a YAML or JSON document. A syntax error, an unknown field or
// a value of the wrong type fails the whole file, as a *Problem (or several
// joined) with its line. A service with an address that does not parse is
// left out and its problems recorded in Bad; servicelb's own rules are
// checked when the services are applied (see Locate).
func Parse(file string, data []byte) (*Parsed, error) {
	p := &Parsed{File: file, Bad: map[string]error{}, index: map[string]int{}, root: &yaml.Node{}}
	if err := yaml.Unmarshal(data, p.root); err != nil {
		return nil, p.yamlProblems(err)
	}
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, p.yamlProblems(err)
	}
	for i := range f.Services {
		s := &f.Services[i]
		path := fmt.Sprintf("services[%d]", i)
		if j, dup := p.index[s.Name]; dup {
			p.Bad[s.Name] = errors.Join(p.Bad[s.Name], &Problem{File: file, Line: p.line(path + ".name"), Service: s.Name,
				Field: "name", Err: fmt.Errorf("duplicate service name, also services[%d]", j)})
			continue
		}
		p.index[s.Name] = i
		svc, err := s.Convert()
		if err != nil {
			p.Bad[s.Name] = p.locateAll(s.Name, err)
			continue
		}
		p.Services = append(p.Services, svc)
	}
	return p, nil
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
