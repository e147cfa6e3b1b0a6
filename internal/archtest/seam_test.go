package archtest

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// backendPackages are the dataplanes: they may read a State only through
// its ServicePorts and node.
var backendPackages = []string{"../../nftables", "../../iptables", "../../ipvs", "../../ebpf", "../../userspace"}

// TestBackendsReadOnlyServicePorts type-checks every backend and fails on
// any use of what a ServicePort does not carry: a raw Service or Endpoint
// (their types, fields or methods) and State.Service / State.Services. So
// every input a backend renders is in the ServicePort, which Diff
// compares in full, and no two backends can decide a semantic apart. Of
// the node, the local-traffic detection is read only as resolved by
// NodeConfig.LocalMatch, never from its raw fields (ClusterCIDRs,
// DetectLocal), so that every backend recognises the same pods; the
// service CIDRs only as NodeConfig.DroppedServiceCIDRs resolves them,
// never from ServiceCIDRs, so that every backend drops the same addresses.
func TestBackendsReadOnlyServicePorts(t *testing.T) {
	pkgs := listExports(t, backendPackages)
	fset := token.NewFileSet()
	imp := exportImporter(fset, pkgs)
	for _, p := range pkgs {
		if !p.Target {
			continue
		}
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		for id, obj := range info.Uses {
			if why := forbidden(obj); why != "" {
				t.Errorf("%s: %s reads %s", fset.Position(id.Pos()), p.ImportPath, why)
			}
		}
	}
}

const servicelbPath = "github.com/kproxy-dev/kproxy/servicelb"

// forbidden says what a used object is, when a backend must not use it.
func forbidden(obj types.Object) string {
	if obj.Pkg() == nil || obj.Pkg().Path() != servicelbPath {
		return ""
	}
	switch o := obj.(type) {
	case *types.TypeName:
		if raw(o.Name()) {
			return "servicelb." + o.Name()
		}
	case *types.Var:
		if o.IsField() {
			owner := fieldOwner(o)
			if raw(owner) || (owner == "NodeConfig" && rawNodeField(o.Name())) {
				return "servicelb." + owner + "." + o.Name()
			}
		}
	case *types.Func:
		sig := o.Type().(*types.Signature)
		if r := sig.Recv(); r != nil {
			recv := strings.TrimPrefix(types.TypeString(r.Type(), nil), "*")
			recv = strings.TrimPrefix(recv, servicelbPath+".")
			if raw(recv) || (recv == "State" && (o.Name() == "Service" || o.Name() == "Services")) ||
				(recv == "NodeConfig" && o.Name() == "LocalMode") {
				return "servicelb." + recv + "." + o.Name()
			}
		}
	}
	return ""
}

// rawNodeField reports whether a NodeConfig field is one that servicelb
// resolves for the backends (LocalMatch, DroppedServiceCIDRs).
func rawNodeField(name string) bool {
	switch name {
	case "ClusterCIDRs", "DetectLocal", "ServiceCIDRs":
		return true
	}
	return false
}

// raw reports whether a servicelb type is part of the raw input model.
func raw(name string) bool {
	switch name {
	case "Service", "Endpoint", "SessionAffinity", "Hints", "DetectLocal":
		return true
	}
	return false
}

// fieldOwner returns the name of the servicelb struct type that declares
// field v.
func fieldOwner(v *types.Var) string {
	scope := v.Pkg().Scope()
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if !ok {
			continue
		}
		st, ok := tn.Type().Underlying().(*types.Struct)
		if !ok {
			continue
		}
		for i := range st.NumFields() {
			if st.Field(i) == v {
				return name
			}
		}
	}
	return ""
}

type listed struct {
	ImportPath, Name, Dir, Export string
	GoFiles                       []string
	Target                        bool
}

// listExports returns the packages and every dependency with its export
// data, built by the go command, the packages themselves marked.
func listExports(t *testing.T, paths []string) []listed {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Name,Dir,Export,GoFiles,DepOnly"}, paths...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			listed
			DepOnly bool
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		p.Target = !p.DepOnly
		pkgs = append(pkgs, p.listed)
	}
	return pkgs
}

// exportImporter imports the listed packages from the export data the go
// command built for them.
func exportImporter(fset *token.FileSet, pkgs []listed) types.Importer {
	exports := map[string]string{}
	for _, p := range pkgs {
		exports[p.ImportPath] = p.Export
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
}
