#!/bin/sh
# Installs what the examples' tests need from Debian when it is missing:
# etcd (package etcd-server), which kube-apiserver stores its state in; its
# own service is not started. kube-apiserver and Consul are built from the
# Go module proxy by internal/testkit/testservers.
set -eu
exec "$(dirname "$0")/../../hack/apt-install.sh" etcd-server
