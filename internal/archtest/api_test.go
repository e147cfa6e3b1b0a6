package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAPINamesNoInternalType type-checks every public package of the core
// and Kubernetes modules and fails on an exported identifier whose type
// names a type of an internal package: a caller could hold such a value
// but not name its type, and the internal package would be part of the
// contract by accident.
func TestAPINamesNoInternalType(t *testing.T) {
	pkgs := listExports(t, []string{module + "/...", module + "/kube/..."})
	imp := exportImporter(token.NewFileSet(), pkgs)
	checked := 0
	for _, p := range pkgs {
		if !p.Target || internal(p.ImportPath) || p.Name == "main" || strings.HasPrefix(p.ImportPath, module+"/examples") {
			continue
		}
		for _, leak := range internalNames(typeCheck(t, p, imp)) {
			t.Errorf("%s: %s", p.ImportPath, leak)
		}
		checked++
	}
	require.Greater(t, checked, 10, "public packages checked")
}

// deprecatedVars are the exported variables of a release kept, read by
// nothing, for its callers until the next minor release removes them.
var deprecatedVars = map[string]bool{
	module + "/servicelb.DefaultNodePortRange": true,
	module + "/servicelb.Localhost":            true,
}

// TestNoMutableExportedGlobals: a public package's exported variables are
// error sentinels, which callers compare with errors.Is and never assign;
// any other value is a constant or a function's result, so that no caller
// can change what another one, or kproxy itself, reads.
func TestNoMutableExportedGlobals(t *testing.T) {
	pkgs := listExports(t, []string{module + "/...", module + "/kube/..."})
	imp := exportImporter(token.NewFileSet(), pkgs)
	errType := types.Universe.Lookup("error").Type()
	for _, p := range pkgs {
		if !p.Target || internal(p.ImportPath) || p.Name == "main" || strings.HasPrefix(p.ImportPath, module+"/examples") {
			continue
		}
		if len(p.GoFiles) == 0 {
			continue
		}
		tp, err := imp.Import(p.ImportPath)
		require.NoError(t, err)
		for _, name := range tp.Scope().Names() {
			v, ok := tp.Scope().Lookup(name).(*types.Var)
			if !ok || !v.Exported() || types.Identical(v.Type(), errType) || deprecatedVars[p.ImportPath+"."+name] {
				continue
			}
			t.Errorf("%s.%s is an exported variable of type %s: make it a constant or a function", p.ImportPath, name, v.Type())
		}
	}
}

// TestAPINamesNoInternalTypeFails: the check finds an internal type in a
// function's result, a field, a method and an alias, and passes a package
// that only uses one inside.
func TestAPINamesNoInternalTypeFails(t *testing.T) {
	fset := token.NewFileSet()
	check := func(path, src string, imp types.Importer) *types.Package {
		f, err := parser.ParseFile(fset, path+".go", src, 0)
		require.NoError(t, err)
		p, err := (&types.Config{Importer: imp}).Check(path, fset, []*ast.File{f}, nil)
		require.NoError(t, err)
		return p
	}
	lab := check("example.com/m/internal/lab", "package lab\ntype Host struct{ Name string }\n", nil)
	imp := importerFunc(func(path string) (*types.Package, error) {
		if path == lab.Path() {
			return lab, nil
		}
		return nil, fmt.Errorf("no package %s", path)
	})
	leaky := check("example.com/m/kit", `package kit
import "example.com/m/internal/lab"
type Env struct{ node *lab.Host }
func (e *Env) Node() *lab.Host { return e.node }
type Reply = lab.Host
type Stage struct{ Before func(*lab.Host) }
func New() (*Env, error) { return nil, nil }
func hidden() lab.Host { return lab.Host{} }
`, imp)
	assert.Equal(t, []string{
		"Env.Node names example.com/m/internal/lab.Host",
		"Reply names example.com/m/internal/lab.Host",
		"Stage.Before names example.com/m/internal/lab.Host",
	}, internalNames(leaky))
	tight := check("example.com/m/kit2", `package kit2
import "example.com/m/internal/lab"
type Env struct{ node *lab.Host }
func (e *Env) Name() string { return e.node.Name }
`, imp)
	assert.Empty(t, internalNames(tight))
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// internal reports whether an import path is of an internal package.
func internal(path string) bool {
	return strings.HasSuffix(path, "/internal") || strings.Contains(path, "/internal/")
}

// internalNames returns, for each exported identifier of p (and each
// exported field and method of its exported types) whose type names an
// internal package's type, what it is and that type.
func internalNames(p *types.Package) []string {
	var out []string
	report := func(what string, t types.Type) {
		for _, n := range namedIn(t, nil) {
			out = append(out, fmt.Sprintf("%s names %s", what, n))
		}
	}
	scope := p.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		tn, ok := obj.(*types.TypeName)
		if !ok {
			report(name, obj.Type())
			continue
		}
		if a, ok := tn.Type().(*types.Alias); ok {
			report(name, a.Rhs())
			continue
		}
		switch u := tn.Type().Underlying().(type) {
		case *types.Struct:
			for i := range u.NumFields() {
				if f := u.Field(i); f.Exported() {
					report(name+"."+f.Name(), f.Type())
				}
			}
		default:
			report(name, u)
		}
		ms := types.NewMethodSet(types.NewPointer(tn.Type()))
		for i := range ms.Len() {
			m := ms.At(i).Obj()
			if m.Exported() && m.Pkg() == p {
				report(name+"."+m.Name(), m.Type())
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// namedIn returns the named types and aliases of internal packages that t
// spells, without looking into the definitions of named types and aliases
// (each is checked as its package's own).
func namedIn(t types.Type, seen map[types.Type]bool) []string {
	if seen == nil {
		seen = map[types.Type]bool{}
	}
	if seen[t] {
		return nil
	}
	seen[t] = true
	var out []string
	switch t := t.(type) {
	case *types.Alias:
		// An alias names its own package's type: cilium/ebpf's ProgramID
		// is a caller's to name, whatever it stands for.
		if obj := t.Obj(); obj.Pkg() != nil && internal(obj.Pkg().Path()) {
			out = append(out, obj.Pkg().Path()+"."+obj.Name())
		}
	case *types.Named:
		if obj := t.Obj(); obj.Pkg() != nil && internal(obj.Pkg().Path()) {
			out = append(out, obj.Pkg().Path()+"."+obj.Name())
		}
		for a := range t.TypeArgs().Types() {
			out = append(out, namedIn(a, seen)...)
		}
	case *types.Pointer:
		out = namedIn(t.Elem(), seen)
	case *types.Slice:
		out = namedIn(t.Elem(), seen)
	case *types.Array:
		out = namedIn(t.Elem(), seen)
	case *types.Chan:
		out = namedIn(t.Elem(), seen)
	case *types.Map:
		out = append(namedIn(t.Key(), seen), namedIn(t.Elem(), seen)...)
	case *types.Signature:
		for v := range t.Params().Variables() {
			out = append(out, namedIn(v.Type(), seen)...)
		}
		for v := range t.Results().Variables() {
			out = append(out, namedIn(v.Type(), seen)...)
		}
	case *types.Struct:
		for i := range t.NumFields() {
			if f := t.Field(i); f.Exported() {
				out = append(out, namedIn(f.Type(), seen)...)
			}
		}
	case *types.Interface:
		for i := range t.NumMethods() {
			if m := t.Method(i); m.Exported() {
				out = append(out, namedIn(m.Type(), seen)...)
			}
		}
	}
	return out
}
