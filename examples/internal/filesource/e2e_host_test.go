//go:build privileged && !vm

package filesource

// vmBackends is empty on the host: its kernel may lack IPVS, which the VM
// tests cover (make test-examples runs them).
var vmBackends []string
