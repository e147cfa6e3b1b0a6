// Package archtest holds, in its tests, the rules of the module's
// architecture that the compiler does not keep, so that a change that
// breaks one fails `make lint` with the rule's reason:
//
//   - the seam: every backend reads a State only through its ServicePorts
//     and the node as servicelb resolves it (seam_test.go);
//   - every backend offers the same entry points with the same
//     signatures, and its Proxier is a servicelb.Proxier and a Renderer
//     (shape_test.go);
//   - every backend's declared capabilities agree with what it renders
//     (capabilities_test.go), and every backend renders a dry run without
//     opening a socket (render_nosocket_linux_test.go);
//   - the import rules, one table with a reason for each
//     (imports_test.go): servicelb depends on nothing of the module, no
//     dataplane on another, no shipped package on a test kit, the netlink
//     stack and xtables on no model, the examples and the Kubernetes
//     layer on public packages only;
//   - no exported API of a public package names an internal type, and
//     no public package exports a variable but an error sentinel
//     (api_test.go).
//
// It has no code of its own: nothing imports it.
package archtest
