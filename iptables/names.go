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

// portHash appends kube-proxy's 16 character hash of a service port to
// b: base32 of sha256 of "service:port" (or "service" for an unnamed port)
// and the protocol in lower case.
func portHash(b []byte, sp *servicelb.ServicePort) []byte {
	var in [128]byte
	return hash16(b, appendPortName(in[:0], sp), sp.Port.Protocol.Lower())
}

// endpointHash appends kube-proxy's hash of one endpoint of a service port
// to b.
func endpointHash(b []byte, sp *servicelb.ServicePort, be servicelb.Backend) []byte {
	var in [128]byte
	return hash16(b, be.AddrPort().AppendTo(append(appendPortName(in[:0], sp), sp.Port.Protocol.Lower()...)))
}

// hash16 appends the first 16 characters of the base32 of sha256 of in
// and more (the first ten bytes of the sum make exactly those).
func hash16(b, in []byte, more ...string) []byte {
	for _, m := range more {
		in = append(in, m...)
	}
	sum := sha256.Sum256(in)
	var out [16]byte
	base32.StdEncoding.Encode(out[:], sum[:10])
	return append(b, out[:]...)
}

// portName is kube-proxy's name of a service port, as its comments show it.
func portName(sp *servicelb.ServicePort) string {
	if sp.Key.Port == "" {
		return sp.Key.Service
	}
	return sp.Key.Service + ":" + sp.Key.Port
}

func appendPortName(b []byte, sp *servicelb.ServicePort) []byte {
	b = append(b, sp.Key.Service...)
	if sp.Key.Port != "" {
		b = append(append(b, ':'), sp.Key.Port...)
	}
	return b
}

// chain returns the name of a chain of a service port: the prefix, the
// kind's prefix and a hash, made with one allocation.
func (n names) chain(kind string, hash func([]byte) []byte) string {
	var b [64]byte
	return string(hash(append(append(b[:0], n.prefix...), kind...)))
}

func (n names) port(kind string, sp *servicelb.ServicePort) string {
	return n.chain(kind, func(b []byte) []byte { return portHash(b, sp) })
}

func (n names) svc(sp *servicelb.ServicePort) string { return n.port(svcPrefix, sp) }
func (n names) svl(sp *servicelb.ServicePort) string { return n.port(svlPrefix, sp) }
func (n names) ext(sp *servicelb.ServicePort) string { return n.port(extPrefix, sp) }
func (n names) fw(sp *servicelb.ServicePort) string  { return n.port(fwPrefix, sp) }
func (n names) sep(sp *servicelb.ServicePort, b servicelb.Backend) string {
	return n.chain(sepPrefix, func(out []byte) []byte { return endpointHash(out, sp, b) })
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
