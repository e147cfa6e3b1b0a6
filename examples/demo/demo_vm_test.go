//go:build vm

package main

// vmBackends are the backends TestDemo also runs in the VM, whose kernel
// has IPVS and dummy links.
var vmBackends = []string{"ipvs"}
