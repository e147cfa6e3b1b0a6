package main

import (
	"testing"

	"github.com/kproxy-dev/kproxy/examples/internal/consulsource"
)

// The example mapping file is valid.
func TestMappingFile(t *testing.T) {
	m, err := consulsource.LoadMapping("mapping.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := m["dns"]; got != (consulsource.Mapping{VIP: "10.96.0.53", Port: 53, Protocol: "UDP"}) {
		t.Errorf("dns: %+v", got)
	}
}
