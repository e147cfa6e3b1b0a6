//go:build vm

package ipvsnl

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func open(t *testing.T, h *netnstest.Host) *Conn {
	t.Helper()
	c, err := Open(t.Context(), Options{NetNS: int(h.NS)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// save returns `ipvsadm -Sn`'s lines, sorted.
func save(t *testing.T, h *netnstest.Host) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(h.Exec(t, "ipvsadm", "-Sn")), "\n")
	slices.Sort(lines)
	return slices.DeleteFunc(lines, func(l string) bool { return l == "" })
}

func send(t *testing.T, c *Conn, b *Batch) {
	t.Helper()
	errs, err := c.Send(t.Context(), b)
	require.NoError(t, err)
	for i, e := range errs {
		require.NoError(t, e, "request %d", i)
	}
}

var (
	web = Service{Family: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 80,
		Scheduler: "wrr", Netmask: 0xffffffff}
	dns = Service{Family: unix.AF_INET6, Protocol: unix.IPPROTO_UDP, Addr: netip.MustParseAddr("fd00:96::a"), Port: 53,
		Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800, Netmask: 128}
	assoc = Service{Family: unix.AF_INET, Protocol: unix.IPPROTO_SCTP, Addr: netip.MustParseAddr("10.96.0.11"), Port: 9,
		Scheduler: "sh", Netmask: 0xffffffff}
	marked = Service{Family: unix.AF_INET, FWMark: 0x10000, Scheduler: "mh", Flags: FlagSched2, Netmask: 0xffffffff}
	web1   = Dest{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080, Weight: 1}
	web2   = Dest{Addr: netip.MustParseAddr("10.244.2.2"), Port: 8080, Weight: 0}
	dns1   = Dest{Addr: netip.MustParseAddr("fd00:244:1::2"), Port: 53, Weight: 2}
	mark1  = Dest{Addr: netip.MustParseAddr("10.244.3.2"), Port: 8080, Weight: 1}
)

// TestWriteAsIpvsadmSees: what a batch writes is what ipvsadm lists, and
// what the package reads back is what it wrote.
func TestWriteAsIpvsadmSees(t *testing.T) {
	netnstest.Require(t, "ip_vs")
	h := netnstest.NewHost(t, "ipvsnl")
	c := open(t, h)
	b := c.Batch()
	for _, s := range []*Service{&web, &dns, &assoc, &marked} {
		b.NewService(s)
	}
	send(t, c, b)
	b = c.Batch()
	b.NewDest(&web, &web1)
	b.NewDest(&web, &web2)
	b.NewDest(&dns, &dns1)
	b.NewDest(&marked, &mark1)
	send(t, c, b)
	assert.Equal(t, []string{
		"-A --sctp-service 10.96.0.11:9 -s sh",
		"-A -f 65536 -s mh -b mh-port",
		"-A -t 10.96.0.10:80 -s wrr",
		"-A -u [fd00:96::a]:53 -s rr -p 10800",
		"-a -f 65536 -r 10.244.3.2:8080 -m -w 1",
		"-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1",
		"-a -t 10.96.0.10:80 -r 10.244.2.2:8080 -m -w 0",
		"-a -u [fd00:96::a]:53 -r [fd00:244:1::2]:53 -m -w 2",
	}, save(t, h))

	got, err := c.Services(t.Context())
	require.NoError(t, err)
	slices.SortFunc(got, func(a, b Service) int { return cmp.Or(cmp.Compare(a.FWMark, b.FWMark), a.Addr.Compare(b.Addr)) })
	assert.Equal(t, []Service{web, assoc, dns, marked}, got)
	dests, err := c.Dests(t.Context(), &web)
	require.NoError(t, err)
	slices.SortFunc(dests, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
	assert.Equal(t, []Dest{web1, web2}, dests)
	dests, err = c.Dests(t.Context(), &dns)
	require.NoError(t, err)
	assert.Equal(t, []Dest{dns1}, dests)

	found, ok, err := c.Service(t.Context(), &Service{Family: unix.AF_INET6, Protocol: unix.IPPROTO_UDP, Addr: dns.Addr, Port: 53})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, dns, found)
	_, ok, err = c.Service(t.Context(), &Service{Family: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Addr: web.Addr, Port: 81})
	require.NoError(t, err)
	assert.False(t, ok)

	b = c.Batch()
	changed := web
	changed.Scheduler, changed.Flags, changed.Timeout = "lc", FlagPersistent, 60
	b.SetService(&changed)
	heavier := web1
	heavier.Weight = 5
	b.SetDest(&web, &heavier)
	b.DelDest(&web, &web2)
	b.DelService(&assoc)
	send(t, c, b)
	assert.Equal(t, []string{
		"-A -f 65536 -s mh -b mh-port",
		"-A -t 10.96.0.10:80 -s lc -p 60",
		"-A -u [fd00:96::a]:53 -s rr -p 10800",
		"-a -f 65536 -r 10.244.3.2:8080 -m -w 1",
		"-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 5",
		"-a -u [fd00:96::a]:53 -r [fd00:244:1::2]:53 -m -w 2",
	}, save(t, h))
}

// TestErrorsPerRequest: IPVS handles every request of a batch; each
// failure is told against its own request, and the requests after it are
// applied.
func TestErrorsPerRequest(t *testing.T) {
	netnstest.Require(t, "ip_vs")
	h := netnstest.NewHost(t, "ipvsnl")
	c := open(t, h)
	b := c.Batch()
	b.NewService(&web)
	b.NewService(&web)        // exists
	b.NewDest(&assoc, &web1)  // no such service
	b.NewService(&assoc)      //
	b.DelDest(&web, &web2)    // no such real server
	b.NewDest(&web, &web1)    //
	b.DelService(&marked)     // no such service
	b.NewDest(&assoc, &mark1) //
	errs, err := c.Send(t.Context(), b)
	require.NoError(t, err)
	require.Len(t, errs, 8)
	for i, want := range []error{nil, unix.EEXIST, unix.ESRCH, nil, unix.ENOENT, nil, unix.ESRCH, nil} {
		if want == nil {
			assert.NoError(t, errs[i], "request %d", i)
		} else {
			assert.ErrorIs(t, errs[i], want, "request %d", i)
		}
	}
	assert.Equal(t, []string{
		"-A --sctp-service 10.96.0.11:9 -s sh",
		"-A -t 10.96.0.10:80 -s wrr",
		"-a --sctp-service 10.96.0.11:9 -r 10.244.3.2:8080 -m -w 1",
		"-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1",
	}, save(t, h))
}
