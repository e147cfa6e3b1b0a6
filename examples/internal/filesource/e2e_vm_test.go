//go:build vm

package filesource

// vmBackends are the backends the packet tests also run in the VM, whose
// kernel has IPVS and dummy links.
var vmBackends = []string{"ipvs"}
