package main

import (
	"fmt"
	"go/types"
	"os"
	"slices"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

// Features returns the sorted exported features of the public packages
// of the modules in dirs.
func Features(dirs ...string) ([]string, error) {
	var out []string
	for _, dir := range dirs {
		cfg := &packages.Config{
			Mode: packages.NeedName | packages.NeedTypes | packages.NeedModule,
			Dir:  dir,
			// The workspace of the modules, not the tool's own; the API
			// of Linux, wherever the check runs.
			Env: append(os.Environ(), "GOWORK=", "GOFLAGS=-mod=readonly", "GOOS=linux", "GOARCH=amd64"),
		}
		pkgs, err := packages.Load(cfg, "./...")
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		for _, p := range pkgs {
			if len(p.Errors) > 0 {
				return nil, fmt.Errorf("load %s: %v", p.PkgPath, p.Errors[0])
			}
			if p.Name == "main" || internal(p.PkgPath) {
				continue
			}
			out = append(out, packageFeatures(p.Types)...)
		}
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

func internal(path string) bool {
	for _, el := range strings.Split(path, "/") {
		if el == "internal" {
			return true
		}
	}
	return false
}

// packageFeatures lists the exported features of one package.
func packageFeatures(pkg *types.Package) []string {
	prefix := "pkg " + pkg.Path() + ", "
	q := func(other *types.Package) string {
		if other == pkg {
			return ""
		}
		return other.Name()
	}
	typ := func(t types.Type) string { return types.TypeString(t, q) }
	sig := func(s *types.Signature) string { return signature(s, q) }
	var out []string
	add := func(format string, args ...any) { out = append(out, prefix+fmt.Sprintf(format, args...)) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", name, typ(o.Type()), o.Val().ExactString())
		case *types.Var:
			add("var %s %s", name, typ(o.Type()))
		case *types.Func:
			sg := o.Type().(*types.Signature)
			add("func %s%s%s", name, typeParams(sg.TypeParams(), q), sig(sg))
		case *types.TypeName:
			if o.IsAlias() {
				add("type %s = %s", name, typ(types.Unalias(o.Type())))
				continue
			}
			named, ok := o.Type().(*types.Named)
			if !ok {
				continue
			}
			decl := "type " + name + typeParams(named.TypeParams(), q)
			switch u := named.Underlying().(type) {
			case *types.Struct:
				add("%s struct", decl)
				for i := range u.NumFields() {
					f := u.Field(i)
					switch {
					case !f.Exported():
					case f.Embedded():
						add("%s struct, embedded %s", decl, typ(f.Type()))
					default:
						add("%s struct, %s %s", decl, f.Name(), typ(f.Type()))
					}
				}
			case *types.Interface:
				var names []string
				for i := range u.NumMethods() {
					m := u.Method(i)
					if m.Exported() {
						names = append(names, m.Name())
					} else {
						names = append(names, "unexported methods")
					}
					if m.Exported() {
						add("%s interface, %s%s", decl, m.Name(), sig(m.Type().(*types.Signature)))
					}
				}
				sort.Strings(names)
				add("%s interface { %s }", decl, strings.Join(slices.Compact(names), ", "))
			default:
				add("%s %s", decl, typ(u))
			}
			for i := range named.NumMethods() {
				m := named.Method(i)
				if !m.Exported() {
					continue
				}
				sg := m.Type().(*types.Signature)
				recv := typ(sg.Recv().Type())
				add("method (%s) %s%s", recv, m.Name(), sig(sg))
			}
		}
	}
	return out
}

// signature writes a signature without its names, which a caller does
// not depend on: "(T1, ...T2) R" or "(T1) (R1, R2)".
func signature(s *types.Signature, q types.Qualifier) string {
	tuple := func(t *types.Tuple, variadic bool) string {
		parts := make([]string, t.Len())
		for i := range t.Len() {
			typ := t.At(i).Type()
			if variadic && i == t.Len()-1 {
				parts[i] = "..." + types.TypeString(typ.(*types.Slice).Elem(), q)
				continue
			}
			parts[i] = types.TypeString(typ, q)
		}
		return strings.Join(parts, ", ")
	}
	out := "(" + tuple(s.Params(), s.Variadic()) + ")"
	switch r := s.Results(); r.Len() {
	case 0:
	case 1:
		out += " " + tuple(r, false)
	default:
		out += " (" + tuple(r, false) + ")"
	}
	return out
}

// typeParams writes a type parameter list, or nothing.
func typeParams(tp *types.TypeParamList, q types.Qualifier) string {
	if tp.Len() == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('[')
	for i := range tp.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		p := tp.At(i)
		b.WriteString(p.Obj().Name() + " " + types.TypeString(p.Constraint(), q))
	}
	b.WriteByte(']')
	return b.String()
}
