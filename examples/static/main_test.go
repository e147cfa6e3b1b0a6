package main

import (
	"os"
	"testing"

	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The commented example file is valid.
func TestExampleFile(t *testing.T) {
	data, err := os.ReadFile("services.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := filesource.Parse("services.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Bad) > 0 {
		t.Fatal(p.Bad)
	}
	if len(p.Services) != 2 {
		t.Errorf("%d services, want 2", len(p.Services))
	}
	if _, err := servicelb.NewState(servicelb.NodeConfig{}, p.Services...); err != nil {
		t.Error(p.Locate(err))
	}
}
