package filesource

import (
	"errors"
	"os"
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// FuzzParse: any file either fails as a whole with problems that carry a
// line, or parses into services and problems each naming its service;
// every servicelb error about a parsed service is placed on a line.
func FuzzParse(f *testing.F) {
	// The example files seed it from the examples module's tree; the VM
	// holds the package's testdata/ alone, and runs the other seeds.
	if _, err := os.Stat("../../go.mod"); err == nil {
		for _, path := range []string{"../../cmd/kproxy/services.yaml", "../../demo/services.yaml"} {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte(`{"services":[{"name":"a/b","clusterIPs":["10.96.0.1"],"ports":[{"port":80}]}]}`))
	f.Add([]byte("services:\n  - name: a/b\n    clusterIPs: [10.96.0.1, 10.96.0.1]\n    ports: [{port: 0}]\n"))
	node := servicelb.NodeConfig{NodeName: "n1"}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data)
		if err != nil {
			for _, e := range leaves(err) {
				var pr *Problem
				if !errors.As(e, &pr) {
					t.Fatalf("a file refused without a problem: %v", e)
				}
			}
			return
		}
		for name, err := range p.Bad {
			for _, e := range leaves(err) {
				var pr *Problem
				if !errors.As(e, &pr) || pr.Service != name || pr.Line <= 0 {
					t.Fatalf("problem of %q not placed: %v", name, e)
				}
			}
		}
		b, err := servicelb.NewBuilder(node)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Services {
			err := b.Upsert(s)
			if err == nil {
				continue
			}
			for _, e := range leaves(p.Locate(err)) {
				var pr *Problem
				if !errors.As(e, &pr) || pr.Service != s.Name || pr.Line <= 0 {
					t.Fatalf("servicelb's error about %q not placed: %v", s.Name, e)
				}
			}
		}
	})
}
