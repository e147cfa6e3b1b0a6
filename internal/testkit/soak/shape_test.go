package soak

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// Shape of the soak.
const (
	backendHosts = 20
	httpPort     = 80   // the service port of the short echo
	httpTarget   = 8080 // where the backends serve it
	linePort     = 81   // the service port of the line echo
	lineTarget   = 8081
	nodeName     = "node"
	// askTimeout bounds a fresh connection and a session's echo.
	askTimeout = 2 * time.Second
	// windowTail is how long a fault's window lasts after the first
	// successful sync after its repair.
	windowTail = 2 * time.Second
	// removedGrace excuses a session failure whose endpoint left its
	// service this recently.
	removedGrace = 5 * time.Second
	// repairTimeout is how long a fault may stay unrepaired before it is a
	// failure of the soak.
	repairTimeout = 3 * time.Minute
	// growthSpan is the least time the samples of the longest-lived
	// proxier must span, after its first minute, for its growth to be
	// held to the limits (-soak.max-rss-growth,
	// -soak.max-goroutine-growth): over less, the slopes follow the
	// garbage collector more than any leak.
	growthSpan = 5 * time.Minute
	// settleTime is how long the soak waits after the final sync before
	// it compares the kernel state.
	settleTime = 3 * time.Second
)

// serviceCIDR holds every cluster IP.
var serviceCIDR = netip.MustParsePrefix("172.16.0.0/12")

// serviceName is the name of service i.
func serviceName(i int) string { return fmt.Sprintf("soak/svc-%04d", i) }

// clusterIP is the cluster IP of service i: the i+1-th address of the
// service CIDR.
func clusterIP(i int) netip.Addr {
	b := serviceCIDR.Addr().As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+uint32(i)+1)
	return netip.AddrFrom4(b)
}
