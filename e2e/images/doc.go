// Package images builds the container images of the real-cluster tests
// without a container runtime or a registry: the test images of the
// Kubernetes release under the names its e2e framework gives them
// (agnhost, stand-ins for nginx and glibc-dns-testing, busybox, pause),
// and kube-proxy's, assembled from the release's binaries and the
// machine's Debian programs with the shared libraries they need, and
// written as OCI archives for `ctr images import`.
package images
