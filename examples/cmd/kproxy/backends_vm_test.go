//go:build vm

package main

// vmBackends are the backends the cleanup and switch tests also use in the
// VM, whose kernel has IPVS and dummy links.
var vmBackends = []string{"ipvs"}

// capsBackends are the backends TestCapabilities runs in the VM: those
// the host cannot.
var capsBackends = vmBackends
