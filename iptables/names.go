//go:build linux

package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/kproxy-dev/kproxy/servicelb"
)

const DefaultChainPrefix = "KPROXY-"

// maxPrefixLen keeps the longest chain name, prefix + "SVC-" + 16, within
// iptables' 28 characters.
const maxPrefixLen = 8

// Fixed chain names after the prefix, as kube-proxy names them.
const (
	chainServices         = "SERVICES"
	chainNodePorts        = "NODEPORTS"
	chainPostrouting      = "POSTROUTING"
	chainMarkMasq         = "MARK-MASQ"
	chainMarkDrop         = "MARK-DROP"
	chainExternalServices = "EXTERNAL-SERVICES"
	chainForward          = "FORWARD"
	chainProxyFirewall    = "PROXY-FIREWALL"
	// chainOffClusterMasq marks traffic from outside every prefix of the
	// local-traffic detection when there are several of one family (one
	// prefix, or an interface, needs no chain).
	chainOffClusterMasq = "OFFCLUSTER-MASQ"
	// chainLocalnet drops traffic to 127.0.0.0/8 from elsewhere, which
	// route_localnet would let in, when node ports are served on
	// localhost: kube-proxy's KUBE-FIREWALL rule, in a chain of its own
	// (kubelet writes a KUBE-FIREWALL too).
	chainLocalnet = "LOCALNET-FIREWALL"
)

// Prefixes of per service port chains after the chain prefix.
const (
	svcPrefix = "SVC-"
	svlPrefix = "SVL-"
	extPrefix = "EXT-"
	fwPrefix  = "FW-"
	sepPrefix = "SEP-"
)

// names builds the chain names of one Proxier.
type names struct {
	prefix string
}

func (n names) fixed(name string) string { return n.prefix + name }

// portHash returns kube-proxy's 16 character hash of a service port:
// base32 of sha256 of "service:port" (or "service" for an unnamed port)
// and the protocol in lower case.
func portHash(sp *servicelb.ServicePort) string {
	return hash16(portName(sp) + sp.Port.Protocol.Lower())
}

// endpointHash returns kube-proxy's hash of one endpoint of a service port.
func endpointHash(sp *servicelb.ServicePort, b servicelb.Backend) string {
	return hash16(portName(sp) + sp.Port.Protocol.Lower() + b.String())
}

func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// portName is kube-proxy's name of a service port, as its comments show it.
func portName(sp *servicelb.ServicePort) string {
	if sp.Key.Port == "" {
		return sp.Key.Service
	}
	return sp.Key.Service + ":" + sp.Key.Port
}

func (n names) svc(sp *servicelb.ServicePort) string { return n.prefix + svcPrefix + portHash(sp) }
func (n names) svl(sp *servicelb.ServicePort) string { return n.prefix + svlPrefix + portHash(sp) }
func (n names) ext(sp *servicelb.ServicePort) string { return n.prefix + extPrefix + portHash(sp) }
func (n names) fw(sp *servicelb.ServicePort) string  { return n.prefix + fwPrefix + portHash(sp) }
func (n names) sep(sp *servicelb.ServicePort, b servicelb.Backend) string {
	return n.prefix + sepPrefix + endpointHash(sp, b)
}

// owns reports whether a chain name is one this prefix's Proxier creates:
// a fixed name, or a per service port prefix followed by a 16 character
// hash. Matching the whole shape, not only the prefix, keeps two Proxiers
// apart even when one prefix starts another ("KUBE-" and "KUBE-X-").
func (n names) owns(name string) bool {
	rest, ok := strings.CutPrefix(name, n.prefix)
	if !ok {
		return false
	}
	switch rest {
	case chainServices, chainNodePorts, chainPostrouting, chainMarkMasq, chainMarkDrop,
		chainExternalServices, chainForward, chainProxyFirewall, chainOffClusterMasq, chainLocalnet:
		return true
	}
	for _, p := range []string{svcPrefix, svlPrefix, extPrefix, fwPrefix, sepPrefix} {
		if h, ok := strings.CutPrefix(rest, p); ok && isHash(h) {
			return true
		}
	}
	return false
}

func isHash(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'A' || c > 'Z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// checkPrefix validates a chain prefix.
func checkPrefix(p string) error {
	if p == "" || len(p) > maxPrefixLen {
		return fmt.Errorf("%w: chain prefix %q: want 1 to %d characters", ErrInvalidOptions, p, maxPrefixLen)
	}
	for _, c := range []byte(p) {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return fmt.Errorf("%w: chain prefix %q: use A-Z, 0-9, '-' and '_'", ErrInvalidOptions, p)
		}
	}
	return nil
}
