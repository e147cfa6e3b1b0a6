package servicelb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Validate checks a service on its own against the node it will run on:
// everything but conflicts with other services, which a Builder finds. It
// returns nil or an error joining one *ValidationError per mistake. The
// defaults apply (see WithDefaults).
func Validate(node *NodeConfig, s *Service) error {
	d := WithDefaults(*s)
	v := validator{node: node, svc: &d}
	v.name()
	v.addresses()
	v.ports()
	v.policies()
	v.endpoints()
	return errors.Join(v.errs...)
}

// ValidateNode checks a NodeConfig.
func ValidateNode(n *NodeConfig) error {
	var errs []error
	for i, a := range n.NodeIPs {
		if err := checkAddr(a); err != nil {
			errs = append(errs, invalid("", fmt.Sprintf("nodeIPs[%d]", i), a, err))
		}
	}
	for i, a := range n.LocalIPs {
		if err := checkAddr(a); err != nil {
			errs = append(errs, invalid("", fmt.Sprintf("localIPs[%d]", i), a, err))
		}
	}
	for _, f := range []struct {
		name string
		ps   []netip.Prefix
	}{{"nodePortAddresses", n.NodePortAddresses}, {"clusterCIDRs", n.ClusterCIDRs}, {"serviceCIDRs", n.ServiceCIDRs}} {
		for i, p := range f.ps {
			if err := checkPrefix(p); err != nil {
				errs = append(errs, invalid("", fmt.Sprintf("%s[%d]", f.name, i), p, err))
			}
		}
	}
	if n.NodePortPrimary && len(n.NodePortAddresses) > 0 {
		errs = append(errs, invalidf("", "nodePortPrimary", nil, ErrInvalidNode,
			"set with nodePortAddresses: %q stands alone, as in kube-proxy", NodePortPrimaryKeyword))
	}
	if r := n.NodePortRange; r != (PortRange{}) && (r.Min == 0 || r.Min > r.Max) {
		errs = append(errs, invalidf("", "nodePortRange", r, ErrInvalidNode, "want 1 <= min <= max"))
	}
	if n.MasqueradeBit > 31 {
		errs = append(errs, invalidf("", "masqueradeBit", n.MasqueradeBit, ErrInvalidNode, "want 0-31"))
	}
	errs = append(errs, validateDetectLocal(n)...)
	return errors.Join(errs...)
}

// validateDetectLocal checks the local-traffic detection: a known mode
// with its parameter, and no parameter of another mode.
func validateDetectLocal(n *NodeConfig) []error {
	d := &n.DetectLocal
	var errs []error
	add := func(field string, value any, kind error, format string, args ...any) {
		errs = append(errs, invalidf("", "detectLocal."+field, value, kind, format, args...))
	}
	mode := n.LocalMode()
	if !slices.Contains(LocalModes(), mode) {
		add("mode", fmt.Sprintf("%q", d.Mode), ErrInvalidNode, "unknown mode, want one of %v", LocalModes())
		return errs
	}
	for i, p := range d.NodeCIDRs {
		if err := checkPrefix(p); err != nil {
			errs = append(errs, invalid("", fmt.Sprintf("detectLocal.nodeCIDRs[%d]", i), p, err))
		}
	}
	params := []struct {
		field string
		mode  LocalMode
		set   bool
	}{
		{"nodeCIDRs", LocalByNodeCIDR, len(d.NodeCIDRs) > 0},
		{"bridgeInterface", LocalByBridgeInterface, d.BridgeInterface != ""},
		{"interfaceNamePrefix", LocalByInterfaceNamePrefix, d.InterfaceNamePrefix != ""},
	}
	for _, p := range params {
		switch {
		case p.set && p.mode != mode:
			add(p.field, nil, ErrInvalidNode, "set with mode %s, used only with mode %s", mode, p.mode)
		case !p.set && p.mode == mode:
			add(p.field, nil, ErrInvalidNode, "missing, mode %s needs it", mode)
		}
	}
	if d.Mode == LocalByClusterCIDR && len(n.ClusterCIDRs) == 0 {
		errs = append(errs, invalidf("", "clusterCIDRs", nil, ErrInvalidNode, "missing, mode %s needs them", mode))
	}
	if err := checkInterface(d.BridgeInterface, MaxInterfaceNameLen); err != nil {
		errs = append(errs, invalid("", "detectLocal.bridgeInterface", fmt.Sprintf("%q", d.BridgeInterface), err))
	}
	if err := checkInterface(d.InterfaceNamePrefix, MaxInterfacePrefixLen); err != nil {
		errs = append(errs, invalid("", "detectLocal.interfaceNamePrefix", fmt.Sprintf("%q", d.InterfaceNamePrefix), err))
	}
	return errs
}

// checkInterface checks an interface name or name prefix (empty is
// checked by the caller): at most max bytes of letters, digits and . _ -,
// which every kernel accepts in a name and no rule syntax reads as a
// wildcard or a quote.
func checkInterface(name string, max int) error {
	switch {
	case name == "":
		return nil
	case len(name) > max:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrNameTooLong, len(name), max)
	case name == "." || name == ".." || !validName(name, false):
		return fmt.Errorf("%w: not an interface name, use letters, digits and . _ -", ErrInvalidName)
	}
	return nil
}

type validator struct {
	node *NodeConfig
	svc  *Service
	errs []error
}

func (v *validator) add(field string, value any, err error) {
	v.errs = append(v.errs, invalid(v.svc.Name, field, value, err))
}

func (v *validator) addf(field string, value any, kind error, format string, args ...any) {
	v.errs = append(v.errs, invalidf(v.svc.Name, field, value, kind, format, args...))
}

func (v *validator) name() {
	n := v.svc.Name
	switch {
	case n == "":
		v.add("name", nil, fmt.Errorf("%w: empty", ErrInvalidName))
	case len(n) > MaxNameLen:
		v.addf("name", nil, ErrNameTooLong, "%d bytes, at most %d", len(n), MaxNameLen)
	case !validName(n, true):
		v.addf("name", nil, ErrInvalidName, "use letters, digits and . _ - /")
	}
}

// validName reports whether s holds only characters every kernel object
// name and rendering can carry unquoted.
func validName(s string, slash bool) bool {
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '-':
		case c == '/' && slash:
		default:
			return false
		}
	}
	return true
}

func checkAddr(a netip.Addr) error {
	switch {
	case !a.IsValid():
		return fmt.Errorf("%w: missing", ErrInvalidAddress)
	case a.IsUnspecified():
		return fmt.Errorf("%w: unspecified", ErrInvalidAddress)
	case a.Is4In6():
		return fmt.Errorf("%w: IPv4-mapped IPv6, use the IPv4 form", ErrInvalidAddress)
	case a.Zone() != "":
		return fmt.Errorf("%w: zoned", ErrInvalidAddress)
	case a.IsLoopback():
		return fmt.Errorf("%w: loopback", ErrInvalidAddress)
	case a.IsMulticast():
		return fmt.Errorf("%w: multicast", ErrInvalidAddress)
	}
	return nil
}

func checkPrefix(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("%w: missing", ErrInvalidPrefix)
	case p.Addr().Is4In6() || p.Addr().Zone() != "":
		return fmt.Errorf("%w: IPv4-mapped or zoned", ErrInvalidPrefix)
	case p.Masked() != p:
		return fmt.Errorf("%w: host bits set, want %s", ErrInvalidPrefix, p.Masked())
	}
	return nil
}

func (v *validator) addresses() {
	s := v.svc
	seen := map[netip.Addr]string{}
	check := func(field string, as []netip.Addr) {
		for i, a := range as {
			f := fmt.Sprintf("%s[%d]", field, i)
			if err := checkAddr(a); err != nil {
				v.add(f, a, err)
				continue
			}
			if prev, ok := seen[a]; ok {
				v.addf(f, a, ErrDuplicateAddress, "also in %s", prev)
				continue
			}
			seen[a] = f
		}
	}
	check("clusterIPs", s.ClusterIPs)
	check("externalIPs", s.ExternalIPs)
	check("loadBalancerIPs", s.LoadBalancerIPs)
	check("proxiedLoadBalancerIPs", s.ProxiedLoadBalancerIPs)
	if len(s.ClusterIPs) > 2 {
		v.addf("clusterIPs", len(s.ClusterIPs), ErrFamilyMismatch, "at most one per family")
	} else if len(s.ClusterIPs) == 2 && s.ClusterIPs[0].IsValid() && s.ClusterIPs[1].IsValid() &&
		FamilyOf(s.ClusterIPs[0]) == FamilyOf(s.ClusterIPs[1]) {
		v.addf("clusterIPs[1]", s.ClusterIPs[1], ErrFamilyMismatch, "second %s cluster IP", FamilyOf(s.ClusterIPs[1]))
	}
	for i, p := range s.SourceRanges {
		if err := checkPrefix(p); err != nil {
			v.add(fmt.Sprintf("sourceRanges[%d]", i), p, err)
		}
	}
}

func (v *validator) ports() {
	s := v.svc
	if len(s.Ports) == 0 {
		v.addf("ports", nil, ErrInvalidPort, "no ports")
	}
	names := map[string]int{}
	type pp struct {
		proto Protocol
		port  uint16
	}
	ports, nodePorts := map[pp]int{}, map[pp]int{}
	r := v.node.Ports()
	for i, p := range s.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		switch {
		case len(p.Name) > MaxPortNameLen:
			v.addf(f+".name", p.Name, ErrNameTooLong, "%d bytes, at most %d", len(p.Name), MaxPortNameLen)
		case !validName(p.Name, false):
			v.addf(f+".name", p.Name, ErrInvalidName, "use letters, digits and . _ -")
		}
		if j, ok := names[p.Name]; ok {
			v.addf(f+".name", fmt.Sprintf("%q", p.Name), ErrDuplicatePortName, "also ports[%d]", j)
		}
		names[p.Name] = i
		if p.Protocol.Number() == 0 {
			v.add(f+".protocol", fmt.Sprintf("%q", p.Protocol), ErrUnknownProtocol)
		}
		if p.Port == 0 {
			v.addf(f+".port", 0, ErrInvalidPort, "zero")
		} else if j, ok := ports[pp{p.Protocol, p.Port}]; ok {
			v.addf(f+".port", p.Port, ErrDuplicatePort, "also ports[%d]", j)
		} else {
			ports[pp{p.Protocol, p.Port}] = i
		}
		if p.NodePort != 0 {
			if !r.Contains(p.NodePort) {
				v.addf(f+".nodePort", p.NodePort, ErrNodePortRange, "range %s", r)
			} else if j, ok := nodePorts[pp{p.Protocol, p.NodePort}]; ok {
				v.addf(f+".nodePort", p.NodePort, ErrDuplicatePort, "also ports[%d]", j)
			} else {
				nodePorts[pp{p.Protocol, p.NodePort}] = i
			}
		}
	}
	if hc := s.HealthCheckNodePort; hc != 0 && !r.Contains(hc) {
		v.addf("healthCheckNodePort", hc, ErrNodePortRange, "range %s", r)
	} else if j, ok := nodePorts[pp{TCP, hc}]; hc != 0 && ok {
		v.addf("healthCheckNodePort", hc, ErrDuplicatePort, "also ports[%d].nodePort", j)
	}
}

func (v *validator) policies() {
	s := v.svc
	for _, p := range []struct {
		field string
		v     TrafficPolicy
	}{{"internalTrafficPolicy", s.InternalTrafficPolicy}, {"externalTrafficPolicy", s.ExternalTrafficPolicy}} {
		if p.v != "" && p.v != PolicyCluster && p.v != PolicyLocal {
			v.add(p.field, fmt.Sprintf("%q", p.v), ErrInvalidPolicy)
		}
	}
	if t := s.Affinity.Timeout; t != 0 {
		if !s.Affinity.ClientIP {
			v.addf("affinity.timeout", t, ErrAffinityTimeout, "set without ClientIP affinity")
		} else if t < MinAffinityTimeout || t > MaxAffinityTimeout {
			v.addf("affinity.timeout", t, ErrAffinityTimeout, "want %s to %s", MinAffinityTimeout, MaxAffinityTimeout)
		} else if t%time.Second != 0 {
			v.addf("affinity.timeout", t, ErrAffinityTimeout, "want a whole number of seconds")
		}
	}
	if !slices.Contains(Schedulers(), s.Scheduler) {
		v.add("scheduler", fmt.Sprintf("%q", s.Scheduler), ErrUnknownScheduler)
	}
}

func (v *validator) endpoints() {
	for i, e := range v.svc.Endpoints {
		f := fmt.Sprintf("endpoints[%d]", i)
		if err := checkAddr(e.Addr); err != nil {
			v.add(f+".addr", e.Addr, err)
		}
		for name, p := range e.Ports {
			if p == 0 {
				v.addf(fmt.Sprintf("%s.ports[%q]", f, name), 0, ErrInvalidPort, "zero")
			}
		}
	}
}
