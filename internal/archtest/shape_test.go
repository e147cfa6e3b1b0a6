package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBackendsHaveOneShape: every backend package offers the same entry
// points with the same signatures (New, ForRendering, Probe and Render,
// all of its Options), and its *Proxier is a servicelb.Proxier, a
// Renderer and a FlowChecker (and, for those whose rules live in
// nf_tables, a Tracer), so that an agent handles any backend one way and
// can ask any for the kernel's word on a flow; and its
// adapter for internal/syncer's Engine is the type engine, so that a
// maintainer finds the same step under one name in each.
func TestBackendsHaveOneShape(t *testing.T) {
	pkgs := listExports(t, backendPackages)
	imp := exportImporter(token.NewFileSet(), pkgs)
	slb, err := imp.Import(servicelbPath)
	require.NoError(t, err)
	proxier := slb.Scope().Lookup("Proxier").Type().Underlying().(*types.Interface)
	renderer := slb.Scope().Lookup("Renderer").Type().Underlying().(*types.Interface)
	checker := slb.Scope().Lookup("FlowChecker").Type().Underlying().(*types.Interface)
	tracer := slb.Scope().Lookup("Tracer").Type().Underlying().(*types.Interface)
	tracing := map[string]bool{"nftables": true, "iptables": true}
	syncer, err := imp.Import(module + "/internal/syncer")
	require.NoError(t, err)
	backend := syncer.Scope().Lookup("Backend").Type().Underlying().(*types.Interface)
	want := map[string]string{
		"New":          "(Options) (*Proxier, error)",
		"ForRendering": "(Options) (*Proxier, error)",
		"Probe":        "(Options) error",
		"Render":       "(*servicelb.State, Options) (string, error)",
	}
	for _, p := range pkgs {
		if !p.Target {
			continue
		}
		pkg, err := imp.Import(p.ImportPath)
		require.NoError(t, err)
		for name, sig := range want {
			fn, ok := pkg.Scope().Lookup(name).(*types.Func)
			if !assert.True(t, ok, "%s has no func %s", pkg.Name(), name) {
				continue
			}
			assert.Equal(t, sig, signature(fn.Type().(*types.Signature), pkg), "%s.%s", pkg.Name(), name)
		}
		px := types.NewPointer(pkg.Scope().Lookup("Proxier").Type())
		assert.True(t, types.Implements(px, proxier), "%s.Proxier is no servicelb.Proxier", pkg.Name())
		assert.True(t, types.Implements(px, renderer), "%s.Proxier is no servicelb.Renderer", pkg.Name())
		assert.True(t, types.Implements(px, checker), "%s.Proxier is no servicelb.FlowChecker", pkg.Name())
		assert.Equal(t, tracing[pkg.Name()], types.Implements(px, tracer), "%s.Proxier is a servicelb.Tracer", pkg.Name())
		src := typeCheck(t, p, imp)
		eng, ok := src.Scope().Lookup("engine").(*types.TypeName)
		if assert.True(t, ok, "%s has no type engine, the adapter internal/syncer drives", pkg.Name()) {
			assert.True(t, types.Implements(types.NewPointer(eng.Type()), backend), "%s's *engine is no syncer.Backend", pkg.Name())
		}
	}
}

// signature writes a function's parameter and result types, qualified
// relative to pkg, without their names.
func signature(sig *types.Signature, pkg *types.Package) string {
	q := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Name()
	}
	list := func(tup *types.Tuple) []string {
		var out []string
		for v := range tup.Variables() {
			out = append(out, types.TypeString(v.Type(), q))
		}
		return out
	}
	s := "(" + strings.Join(list(sig.Params()), ", ") + ")"
	switch res := list(sig.Results()); len(res) {
	case 0:
	case 1:
		s += " " + res[0]
	default:
		s += " (" + strings.Join(res, ", ") + ")"
	}
	return s
}

// typeCheck type-checks a listed package from its source, unexported
// declarations included, with imp for its imports.
func typeCheck(t *testing.T, p listed, imp types.Importer) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	pkg, err := (&types.Config{Importer: imp}).Check(p.ImportPath, fset, files, nil)
	require.NoError(t, err, "type-check %s", p.ImportPath)
	return pkg
}
