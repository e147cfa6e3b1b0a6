//go:build linux

package netnstest

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func netipPort(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }

func TestAddressing(t *testing.T) {
	for _, c := range []struct{ got, want netip.Addr }{
		{BackendIPv4(0), netip.MustParseAddr("10.244.1.2")},
		{BackendIPv6(0), netip.MustParseAddr("fd00:244:1::2")},
		{BackendIPv4(9), netip.MustParseAddr("10.244.10.2")},
		{BackendIPv6(9), netip.MustParseAddr("fd00:244:a::2")},
		{gateway(BackendIPv6(9)), netip.MustParseAddr("fd00:244:a::1")},
		{gateway(ClientIPv4()), NodeIPv4()},
		{gateway(ClientIPv6()), NodeIPv6()},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	for i := range maxBackends {
		if !ClusterCIDRs()[0].Contains(BackendIPv4(i)) || !ClusterCIDRs()[1].Contains(BackendIPv6(i)) {
			t.Fatalf("backend %d outside the cluster CIDRs", i)
		}
	}
	if ClusterCIDRs()[0].Contains(ClientIPv4()) || ClusterCIDRs()[1].Contains(ClientIPv6()) {
		t.Error("client inside the cluster CIDRs")
	}
}

func TestLeftoverPID(t *testing.T) {
	for name, want := range map[string]int{
		"kpt-123-abc-node": 123, "kpt-123-abc-backend-10": 123,
		"kpt-x-abc-node": 0, "kpt-123": 0, "kpt--1-a-b": 0, "other-123-a-b": 0, "kpt-0-a-b": 0,
	} {
		pid, ok := leftoverPID(name)
		if ok != (want != 0) || pid != want {
			t.Errorf("leftoverPID(%q) = %d, %v; want %d", name, pid, ok, want)
		}
	}
	if !alive(os.Getpid()) {
		t.Error("this process is not alive")
	}
}

func TestParseReply(t *testing.T) {
	r, err := parseReply("backend-1 [fd00:c::2]:40000\n")
	if err != nil || r.Host != "backend-1" || r.Client != netip.MustParseAddrPort("[fd00:c::2]:40000") || r.Port != 0 {
		t.Errorf("got %+v, %v", r, err)
	}
	r, err = parseReply("backend-1 10.0.0.1:40000 8081\n")
	if err != nil || r.Host != "backend-1" || r.Client != netip.MustParseAddrPort("10.0.0.1:40000") || r.Port != 8081 {
		t.Errorf("got %+v, %v", r, err)
	}
	for _, bad := range []string{"", "backend-1", " 1.2.3.4:5", "backend-1 1.2.3.4", "backend-1 x:1", "backend-1 1.2.3.4:5 x", "backend-1 1.2.3.4:5 70000", "a 1.2.3.4:5 6 7"} {
		if _, err := parseReply(bad); err == nil {
			t.Errorf("parseReply(%q) accepted", bad)
		}
	}
}

func TestClassify(t *testing.T) {
	for err, want := range map[error]error{
		fmt.Errorf("connect: %w", unix.ECONNREFUSED): ErrRefused,
		unix.EHOSTUNREACH: ErrRefused,
		unix.EACCES:       ErrRefused,
		unix.ECONNRESET:   ErrRefused,
		fmt.Errorf("read: %w", os.ErrDeadlineExceeded): ErrTimeout,
		unix.ETIMEDOUT:                  ErrTimeout,
		errors.New("malformed"):         nil,
		fmt.Errorf("x: %w", unix.EPERM): ErrFiltered,
	} {
		if got := classify(err); got != want {
			t.Errorf("classify(%v) = %v, want %v", err, got, want)
		}
	}
	e := &AskError{Proto: "tcp", Kind: ErrRefused, Err: unix.ECONNREFUSED}
	if !errors.Is(e, ErrRefused) || !errors.Is(e, unix.ECONNREFUSED) || errors.Is(e, ErrTimeout) {
		t.Errorf("AskError does not unwrap to its kind and cause")
	}
	if failureKey(e) != KeyRefused || failureKey(errors.New("x")) != KeyError {
		t.Error("failureKey")
	}
}

func TestMissingGroups(t *testing.T) {
	igmp6 := `1    lo              ff020000000000000000000000000001     1 0000000C 0
2    eth0            ff0200000000000000000001ff000002     1 00000004 0
2    eth0            ff020000000000000000000000000001     1 0000000C 0
3    ext0            ff0200000000000000000001ff000007     1 00000004 0
`
	got := missingGroups(igmp6, "eth0", []netip.Addr{
		netip.MustParseAddr("fd00:c::2"), netip.MustParseAddr("fd00:c::7"), netip.MustParseAddr("2001:db8::1:2"),
	})
	want := []netip.Addr{netip.MustParseAddr("fd00:c::7"), netip.MustParseAddr("2001:db8::1:2")}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("missing %v, want %v", got, want)
	}
}

// TestCanonicalListing: two listings of one table that differ only in
// handles, in the order of set elements and in the order objects are
// listed canonicalise alike; a listing with a rule more does not.
func TestCanonicalListing(t *testing.T) {
	const a = `{"nftables": [{"metainfo": {"version": "1.0.6"}},
{"table": {"family": "inet", "name": "t", "handle": 1}},
{"set": {"family": "inet", "name": "s", "table": "t", "type": "ipv4_addr", "handle": 2, "elem": ["10.0.0.1", "10.0.0.2"]}},
{"chain": {"family": "inet", "table": "t", "name": "c", "handle": 3}},
{"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 4, "expr": [{"accept": null}]}},
{"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 5, "expr": [{"drop": null}]}}]}`
	const b = `{"nftables": [{"metainfo": {"version": "1.0.6"}},
{"table": {"family": "inet", "name": "t", "handle": 7}},
{"chain": {"family": "inet", "table": "t", "name": "c", "handle": 8}},
{"set": {"family": "inet", "name": "s", "table": "t", "type": "ipv4_addr", "handle": 9, "elem": ["10.0.0.2", "10.0.0.1"]}},
{"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 10, "expr": [{"accept": null}]}},
{"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 11, "expr": [{"drop": null}]}}]}`
	ca, err := CanonicalListing(a)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := CanonicalListing(b)
	if err != nil {
		t.Fatal(err)
	}
	if ca != cb {
		t.Errorf("canonical forms differ:\n%s\n%s", ca, cb)
	}
	more := strings.TrimSuffix(a, "]}") + `, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 6, "expr": [{"drop": null}]}}]}`
	if cm, err := CanonicalListing(more); err != nil || cm == ca {
		t.Errorf("a rule more canonicalises alike (%v)", err)
	}
	if _, err := CanonicalListing("not json"); err == nil {
		t.Error("a listing that is not JSON was accepted")
	}
}
