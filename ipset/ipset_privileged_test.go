//go:build privileged || vm

package ipset_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/ipset"
)

func newClient(t *testing.T, h *netnstest.Host, prefix string) *ipset.Client {
	t.Helper()
	c, err := ipset.New(ipset.Options{NetNS: h.NS, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var (
	ip   = netip.MustParseAddr
	pfx  = netip.MustParsePrefix
	tcp  = ipset.TCP
	udp  = ipset.UDP
	sctp = ipset.SCTP
)

// typeCase is one set type: the set, entries to put in it, and the lines
// `ipset save` prints for them.
type typeCase struct {
	set     ipset.Set
	entries []ipset.Entry
	save    []string
	create  string // what the create line of `ipset save` shows after the type
}

func typeCases() []typeCase {
	return []typeCase{
		{
			set:     ipset.Set{Name: "CLUSTER-IP", Type: ipset.HashIPPort, Family: ipset.IPv4, Comment: true},
			entries: []ipset.Entry{{IP: ip("10.96.0.10"), Protocol: tcp, Port: 80, Comment: "default/web:http"}, {IP: ip("10.96.0.10"), Protocol: udp, Port: 53}, {IP: ip("10.96.0.11"), Protocol: sctp, Port: 9000}},
			save:    []string{`add KPT-CLUSTER-IP 10.96.0.10,tcp:80 comment "default/web:http"`, "add KPT-CLUSTER-IP 10.96.0.10,udp:53", "add KPT-CLUSTER-IP 10.96.0.11,sctp:9000"},
			create:  "family inet hashsize 1024 maxelem 65536",
		},
		{
			set:     ipset.Set{Name: "LOOP-BACK", Type: ipset.HashIPPortIP, Family: ipset.IPv4},
			entries: []ipset.Entry{{IP: ip("10.244.1.2"), Protocol: tcp, Port: 8080, IP2: ip("10.244.1.2")}},
			save:    []string{"add KPT-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2"},
		},
		{
			set:     ipset.Set{Name: "LB-SOURCE-CIDR", Type: ipset.HashIPPortNet, Family: ipset.IPv4, MaxElem: 1000, HashSize: 64},
			entries: []ipset.Entry{{IP: ip("203.0.113.7"), Protocol: tcp, Port: 443, Net: pfx("192.0.2.0/24")}},
			save:    []string{"add KPT-LB-SOURCE-CIDR 203.0.113.7,tcp:443,192.0.2.0/24"},
			create:  "family inet hashsize 64 maxelem 1000",
		},
		{
			set:     ipset.Set{Name: "LB-SOURCE-IP", Type: ipset.HashIPPortIP, Family: ipset.IPv6},
			entries: []ipset.Entry{{IP: ip("fd00::7"), Protocol: udp, Port: 53, IP2: ip("fd00:c::2")}},
			save:    []string{"add KPT-LB-SOURCE-IP fd00::7,udp:53,fd00:c::2"},
		},
		{
			set:     ipset.Set{Name: "EXTERNAL-IP6", Type: ipset.HashIP, Family: ipset.IPv6, Timeout: 300 * time.Second},
			entries: []ipset.Entry{{IP: ip("2001:db8::1"), Timeout: 120 * time.Second}},
			save:    []string{"add KPT-EXTERNAL-IP6 2001:db8::1 timeout 1"}, // timeout checked apart (it runs)
			create:  "family inet6 hashsize 1024 maxelem 65536 timeout 300",
		},
		{
			set:     ipset.Set{Name: "NODE-IP", Type: ipset.HashIP, Family: ipset.IPv4},
			entries: []ipset.Entry{{IP: ip("198.51.100.1")}, {IP: ip("::ffff:198.51.100.9")}},
			save:    []string{"add KPT-NODE-IP 198.51.100.1", "add KPT-NODE-IP 198.51.100.9"},
		},
		{
			set:     ipset.Set{Name: "CLUSTER-CIDR", Type: ipset.HashNet, Family: ipset.IPv4},
			entries: []ipset.Entry{{Net: pfx("10.244.0.0/16")}, {Net: pfx("10.1.2.3/32")}},
			save:    []string{"add KPT-CLUSTER-CIDR 10.244.0.0/16", "add KPT-CLUSTER-CIDR 10.1.2.3"},
		},
		{
			set:     ipset.Set{Name: "NODE-PORT-TCP", Type: ipset.BitmapPort, PortFrom: 0, PortTo: 65535},
			entries: []ipset.Entry{{Port: 30080}, {Port: 32000}},
			save:    []string{"add KPT-NODE-PORT-TCP 30080", "add KPT-NODE-PORT-TCP 32000"},
			create:  "range 0-65535",
		},
		{
			set:     ipset.Set{Name: "NODE-PORT-UDP", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 32767, Counters: true},
			entries: []ipset.Entry{{Port: 30000}, {Port: 32767}},
			save:    []string{"add KPT-NODE-PORT-UDP 30000 packets 0 bytes 0", "add KPT-NODE-PORT-UDP 32767 packets 0 bytes 0"},
			create:  "range 30000-32767 counters",
		},
	}
}

// saveLines returns the `ipset save` lines of the set kernelName, sorted,
// with running timeouts replaced by "timeout 1".
func saveLines(t *testing.T, h *netnstest.Host, kernelName string) (create string, adds []string) {
	t.Helper()
	for _, line := range strings.Split(h.Exec(t, "ipset", "save", kernelName), "\n") {
		if i := strings.Index(line, " timeout "); i >= 0 && strings.HasPrefix(line, "add ") {
			line = line[:i] + " timeout 1" + strings.TrimLeft(line[i+len(" timeout "):], "0123456789")
		}
		switch {
		case strings.HasPrefix(line, "create "):
			create = line
		case strings.HasPrefix(line, "add "):
			adds = append(adds, line)
		}
	}
	sort.Strings(adds)
	return create, adds
}

func TestSetTypes(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	for _, tc := range typeCases() {
		t.Run(string(tc.set.Type)+"/"+tc.set.Family.String(), func(t *testing.T) {
			if err := c.Create(ctx, tc.set); err != nil {
				t.Fatal(err)
			}
			if err := c.Add(ctx, tc.set.Name, tc.entries...); err != nil {
				t.Fatal(err)
			}
			info, got, err := c.Entries(ctx, tc.set.Name)
			if err != nil {
				t.Fatal(err)
			}
			checkHeader(t, tc.set, info, len(tc.entries))
			checkEntries(t, tc.entries, got)
			create, adds := saveLines(t, h, c.KernelName(tc.set.Name))
			if !strings.HasPrefix(create, "create KPT-"+tc.set.Name+" "+string(tc.set.Type)+" "+tc.create) {
				t.Errorf("ipset save: create line %q, want it to start with the type and %q", create, tc.create)
			}
			want := slices.Clone(tc.save)
			sort.Strings(want)
			if diff := cmp.Diff(want, adds); diff != "" {
				t.Errorf("ipset save (-want +got):\n%s", diff)
			}
			for _, e := range tc.entries {
				if ok, err := c.Test(ctx, tc.set.Name, e); err != nil || !ok {
					t.Errorf("Test(%v) = %v, %v; want true", e, ok, err)
				}
			}
		})
	}
}

func checkHeader(t *testing.T, want ipset.Set, got *ipset.SetInfo, n int) {
	t.Helper()
	if got.Name != want.Name || got.Type != want.Type || got.Family != want.Family || got.Timeout != want.Timeout ||
		got.Comment != want.Comment || got.Counters != want.Counters || got.PortFrom != want.PortFrom || got.PortTo != want.PortTo {
		t.Errorf("header = %+v, want %+v", got.Set, want)
	}
	if want.MaxElem != 0 && got.MaxElem != want.MaxElem {
		t.Errorf("maxelem = %d, want %d", got.MaxElem, want.MaxElem)
	}
	if int(got.Entries) != n {
		t.Errorf("header counts %d entries, want %d", got.Entries, n)
	}
}

// checkEntries compares listed entries with the ones added, in canonical
// form (IPv4 unmapped), with timeouts checked to be running, not equal.
func checkEntries(t *testing.T, added, listed []ipset.Entry) {
	t.Helper()
	var want, got []ipset.Entry
	for _, e := range added {
		e.IP, e.IP2 = e.IP.Unmap(), e.IP2.Unmap()
		want = append(want, e)
	}
	for _, e := range listed {
		if e.Timeout != 0 {
			i := slices.IndexFunc(want, func(w ipset.Entry) bool { return w.String() == e.String() })
			if i < 0 || e.Timeout > want[i].Timeout || e.Timeout < want[i].Timeout-10*time.Second {
				t.Errorf("entry %v: remaining timeout %v, want about %v", e, e.Timeout, want)
			}
			e.Timeout = want[i].Timeout
		}
		got = append(got, e)
	}
	less := func(a, b ipset.Entry) int { return strings.Compare(a.String(), b.String()) }
	slices.SortFunc(want, less)
	slices.SortFunc(got, less)
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("listed entries (-want +got):\n%s", diff)
	}
}

func TestListDestroyCleanup(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	a := newClient(t, h, "KPA-")
	b := newClient(t, h, "KPB-")
	ctx := t.Context()
	h.Exec(t, "ipset", "create", "FOREIGN", "hash:ip")
	for _, c := range []*ipset.Client{a, b} {
		for _, name := range []string{"ONE", "TWO"} {
			if err := c.Create(ctx, ipset.Set{Name: name, Type: ipset.HashIP, Family: ipset.IPv4}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := a.Add(ctx, "ONE", ipset.Entry{IP: ip("10.0.0.1")}); err != nil {
		t.Fatal(err)
	}
	names := func(c *ipset.Client) []string {
		sets, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range sets {
			out = append(out, s.Name)
		}
		sort.Strings(out)
		return out
	}
	if diff := cmp.Diff([]string{"ONE", "TWO"}, names(a)); diff != "" {
		t.Errorf("a.List (-want +got):\n%s", diff)
	}
	if err := a.Destroy(ctx, "TWO"); err != nil {
		t.Fatal(err)
	}
	if err := a.Destroy(ctx, "TWO"); !errors.Is(err, ipset.ErrNotExist) {
		t.Errorf("second Destroy: %v, want ErrNotExist", err)
	}
	if err := a.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if got := names(a); len(got) != 0 {
		t.Errorf("after a.Cleanup, a still lists %v", got)
	}
	if diff := cmp.Diff([]string{"ONE", "TWO"}, names(b)); diff != "" {
		t.Errorf("b's sets after a.Cleanup (-want +got):\n%s", diff)
	}
	out := h.Exec(t, "ipset", "list", "-n")
	if diff := cmp.Diff([]string{"FOREIGN", "KPB-ONE", "KPB-TWO"}, sortedFields(out)); diff != "" {
		t.Errorf("ipset list -n (-want +got):\n%s", diff)
	}
}

func sortedFields(s string) []string {
	f := strings.Fields(s)
	sort.Strings(f)
	return f
}

func TestCreateExistingEnsure(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	s := ipset.Set{Name: "S", Type: ipset.HashIPPort, Family: ipset.IPv4, Comment: true}
	if err := c.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(ctx, "S", ipset.Entry{IP: ip("10.0.0.1"), Protocol: tcp, Port: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, s); !errors.Is(err, ipset.ErrExist) {
		t.Errorf("Create again: %v, want ErrExist", err)
	}
	if err := c.Ensure(ctx, s); err != nil {
		t.Errorf("Ensure of an identical set: %v", err)
	}
	other := s
	other.Type = ipset.HashIP
	if err := c.Ensure(ctx, other); !errors.Is(err, ipset.ErrIncompatible) {
		t.Errorf("Ensure with another type: %v, want ErrIncompatible", err)
	}
	if info, err := c.Get(ctx, "S"); err != nil || info.Entries != 1 || info.Type != ipset.HashIPPort {
		t.Errorf("after Ensure the set changed: %+v, %v", info, err)
	}
}

// TestBadInputChangesNothing: invalid sets and entries are rejected
// before anything reaches the kernel; a batch with one bad entry adds none.
func TestBadInputChangesNothing(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	if err := c.Create(ctx, ipset.Set{Name: "IPPORT", Type: ipset.HashIPPort, Family: ipset.IPv4}); err != nil {
		t.Fatal(err)
	}
	before := h.Exec(t, "ipset", "save")
	var sent []string
	ipset.Observe(c, func(cmd string, n int) { sent = append(sent, cmd) })
	good := ipset.Entry{IP: ip("10.0.0.1"), Protocol: tcp, Port: 80}
	for name, entries := range map[string][]ipset.Entry{
		"wrong family": {good, {IP: ip("fd00::1"), Protocol: tcp, Port: 80}},
		"no protocol":  {good, {IP: ip("10.0.0.2"), Port: 80}},
		"extra net":    {good, {IP: ip("10.0.0.2"), Protocol: tcp, Port: 80, Net: pfx("10.0.0.0/8")}},
		"comment":      {good, {IP: ip("10.0.0.2"), Protocol: tcp, Port: 80, Comment: "no comments here"}},
		"timeout":      {good, {IP: ip("10.0.0.2"), Protocol: tcp, Port: 80, Timeout: time.Second}},
	} {
		err := c.Add(ctx, "IPPORT", entries...)
		var ee *ipset.EntryError
		if !errors.Is(err, ipset.ErrInvalid) || !errors.As(err, &ee) || ee.Set != "IPPORT" {
			t.Errorf("%s: Add error %v, want an EntryError", name, err)
		}
		if _, err := c.Sync(ctx, "IPPORT", entries); !errors.Is(err, ipset.ErrInvalid) {
			t.Errorf("%s: Sync error %v, want ErrInvalid", name, err)
		}
	}
	for _, s := range []ipset.Set{
		{Name: strings.Repeat("N", 28), Type: ipset.HashIP, Family: ipset.IPv4}, // 32 bytes with the prefix
		{Name: "BAD", Type: "hash:mac", Family: ipset.IPv4},
		{Name: "BAD", Type: ipset.HashIP},
		{Name: "BAD", Type: ipset.BitmapPort, PortFrom: 10, PortTo: 5},
		{Name: "BAD", Type: ipset.HashNet, Family: ipset.IPv4, Timeout: 1500 * time.Millisecond},
	} {
		if err := c.Create(ctx, s); !errors.Is(err, ipset.ErrInvalid) {
			t.Errorf("Create(%+v): %v, want ErrInvalid", s, err)
		}
	}
	for _, cmd := range sent {
		if cmd != "list" && cmd != "protocol" && cmd != "type" {
			t.Errorf("a rejected call sent %q to the kernel", cmd)
		}
	}
	if after := h.Exec(t, "ipset", "save"); after != before {
		t.Errorf("ipset state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestIndex checks the set index against the one the kernel reports to
// getsockopt(SO_IP_SET), the way iptables learns it.
func TestIndex(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	for _, name := range []string{"A", "B", "C"} {
		if err := c.Create(ctx, ipset.Set{Name: name, Type: ipset.HashIP, Family: ipset.IPv4}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Destroy(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"B", "C"} {
		got, err := c.Index(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want := sockoptIndex(t, h, c.KernelName(name))
		if got != want {
			t.Errorf("Index(%s) = %d, getsockopt says %d", name, got, want)
		}
	}
	if _, err := c.Index(ctx, "A"); !errors.Is(err, ipset.ErrNotExist) {
		t.Errorf("Index of a destroyed set: %v, want ErrNotExist", err)
	}
}

// TestInUse: a set an iptables rule references cannot be destroyed;
// Cleanup destroys the others and reports it.
func TestInUse(t *testing.T) {
	netnstest.Require(t, "ipset", "nft_compat")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	for _, name := range []string{"USED", "FREE"} {
		if err := c.Create(ctx, ipset.Set{Name: name, Type: ipset.HashIPPort, Family: ipset.IPv4}); err != nil {
			t.Fatal(err)
		}
	}
	h.Exec(t, "iptables-nft", "-A", "INPUT", "-m", "set", "--match-set", "KPT-USED", "dst,dst", "-j", "ACCEPT")
	if info, err := c.Get(ctx, "USED"); err != nil || info.References != 1 {
		t.Errorf("Get: %+v, %v; want 1 reference", info, err)
	}
	if err := c.Destroy(ctx, "USED"); !errors.Is(err, ipset.ErrInUse) {
		t.Errorf("Destroy of a referenced set: %v, want ErrInUse", err)
	}
	if err := c.Cleanup(ctx); !errors.Is(err, ipset.ErrInUse) || !strings.Contains(err.Error(), "KPT-USED") {
		t.Errorf("Cleanup: %v, want ErrInUse naming KPT-USED", err)
	}
	if out := h.Exec(t, "ipset", "list", "-n"); strings.TrimSpace(out) != "KPT-USED" {
		t.Errorf("after Cleanup: sets %q, want only KPT-USED", out)
	}
	h.Exec(t, "iptables-nft", "-D", "INPUT", "-m", "set", "--match-set", "KPT-USED", "dst,dst", "-j", "ACCEPT")
	if err := c.Cleanup(ctx); err != nil {
		t.Errorf("Cleanup after the rule is gone: %v", err)
	}
}

func TestTestMembership(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	if err := c.Create(ctx, ipset.Set{Name: "NETS", Type: ipset.HashNet, Family: ipset.IPv6}); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(ctx, "NETS", ipset.Entry{Net: pfx("fd00:244::/48")}); err != nil {
		t.Fatal(err)
	}
	for e, want := range map[string]bool{"fd00:244::/48": true, "fd00:244:1::/64": false, "fd00:244::7/128": true, "fd00:245::/64": false} {
		got, err := c.Test(ctx, "NETS", ipset.Entry{Net: pfx(e)})
		if err != nil || got != want {
			t.Errorf("Test(%s) = %v, %v; want %v", e, got, err, want)
		}
	}
	if err := c.Create(ctx, ipset.Set{Name: "SRC", Type: ipset.HashIPPortNet, Family: ipset.IPv4}); err != nil {
		t.Fatal(err)
	}
	lb := ipset.Entry{IP: ip("203.0.113.7"), Protocol: tcp, Port: 443, Net: pfx("192.0.2.0/24")}
	if err := c.Add(ctx, "SRC", lb); err != nil {
		t.Fatal(err)
	}
	for e, want := range map[string]bool{"192.0.2.0/24": true, "192.0.2.9/32": true, "192.0.2.0/25": false, "198.51.100.1/32": false} {
		probe := lb
		probe.Net = pfx(e)
		if got, err := c.Test(ctx, "SRC", probe); err != nil || got != want {
			t.Errorf("Test(%v) = %v, %v; want %v", probe, got, err, want)
		}
	}
	if err := c.Delete(ctx, "NETS", ipset.Entry{Net: pfx("fd00:244::/48")}, ipset.Entry{Net: pfx("fd00:999::/48")}); err != nil {
		t.Errorf("Delete with an absent entry: %v", err)
	}
	if out := h.Exec(t, "ipset", "save", "KPT-NETS"); strings.Contains(out, "add ") {
		t.Errorf("entries left:\n%s", out)
	}
	if _, err := c.Test(ctx, "MISSING", ipset.Entry{Net: pfx("fd00::/64")}); !errors.Is(err, ipset.ErrNotExist) {
		t.Errorf("Test on a missing set: %v, want ErrNotExist", err)
	}
}

func TestCanceledContext(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := c.Create(ctx, ipset.Set{Name: "X", Type: ipset.HashIP, Family: ipset.IPv4})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Create with a canceled context: %v", err)
	}
	if out := h.Exec(t, "ipset", "list", "-n"); strings.TrimSpace(out) != "" {
		t.Errorf("sets after a canceled Create: %q", out)
	}
}

// TestRestoreMatchesKernel feeds Restore's text to `ipset restore` and
// checks that the kernel then holds what the client creates from the same
// description.
func TestRestoreMatchesKernel(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	for _, tc := range typeCases() {
		text, err := ipset.Restore("KPR-", tc.set, tc.entries)
		if err != nil {
			t.Fatal(err)
		}
		h.ExecInput(t, text, "ipset", "restore")
		if err := c.Create(ctx, tc.set); err != nil {
			t.Fatal(err)
		}
		if err := c.Add(ctx, tc.set.Name, tc.entries...); err != nil {
			t.Fatal(err)
		}
		rc, radds := saveLines(t, h, "KPR-"+tc.set.Name)
		cc, cadds := saveLines(t, h, "KPT-"+tc.set.Name)
		norm := func(s string) string {
			s = strings.ReplaceAll(s, "KPR-", "KPT-")
			if i := strings.Index(s, " initval "); i >= 0 { // random per set
				s = s[:i]
			}
			return s
		}
		if norm(rc) != norm(cc) {
			t.Errorf("%s: ipset restore made\n%s\nthe client made\n%s", tc.set.Name, rc, cc)
		}
		for i := range radds {
			radds[i] = norm(radds[i])
		}
		if diff := cmp.Diff(cadds, radds); diff != "" {
			t.Errorf("%s entries (-client +restore):\n%s", tc.set.Name, diff)
		}
	}
}
