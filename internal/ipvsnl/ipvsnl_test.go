//go:build linux

package ipvsnl

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// attr is one decoded attribute; the command's nests are decoded too.
type attr struct {
	Type   uint16
	Value  []byte
	Nested []attr
}

func decode(b []byte, nest bool) []attr {
	var out []attr
	for typ, v := range nl.Attrs(b) {
		a := attr{Type: typ, Value: slices.Clone(v)}
		if nest {
			a.Value, a.Nested = nil, decode(v, false)
		}
		out = append(out, a)
	}
	return out
}

// message is one encoded request: its generic netlink header and its
// attributes.
type message struct {
	typ, flags uint16
	cmd        uint8
	attrs      []attr
}

// messages decodes a batch's requests.
func messages(t *testing.T, b *Batch) []message {
	t.Helper()
	var out []message
	buf := b.b.Wire()
	for len(buf) > 0 {
		l := int(binary.NativeEndian.Uint32(buf))
		require.GreaterOrEqual(t, l, 16+unix.GENL_HDRLEN)
		m := message{typ: binary.NativeEndian.Uint16(buf[4:]), flags: binary.NativeEndian.Uint16(buf[6:]), cmd: buf[16]}
		require.Equal(t, uint8(version), buf[17], "generic netlink version")
		m.attrs = decode(buf[16+unix.GENL_HDRLEN:l], true)
		out = append(out, m)
		buf = buf[(l+3)&^3:]
	}
	return out
}

func ne16(v uint16) []byte { return binary.NativeEndian.AppendUint16(nil, v) }
func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// TestEncoding: the requests carry the attributes ipvsadm (libipvs) sends:
// the whole service to create or change one, its key alone (and the real
// server) otherwise.
func TestEncoding(t *testing.T) {
	b := &Batch{family: 0x1d}
	svc := &Service{Family: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 80,
		Scheduler: "wrr", Flags: FlagPersistent, Timeout: 10800, Netmask: 0xffffffff}
	mark := &Service{Family: unix.AF_INET6, FWMark: 0x10000, Scheduler: "mh", Flags: FlagSched2, Netmask: 128}
	dst := &Dest{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080, Weight: 3, FwdMethod: Masquerade}
	b.NewService(svc)
	b.SetService(mark)
	b.NewDest(svc, dst)
	b.DelDest(svc, dst)
	b.DelService(mark)
	require.Equal(t, 5, b.Len())

	svcKey := []attr{
		{Type: svcAF, Value: ne16(unix.AF_INET)},
		{Type: svcProtocol, Value: ne16(unix.IPPROTO_TCP)},
		{Type: svcAddr, Value: []byte{10, 96, 0, 10}},
		{Type: svcPort, Value: be16(80)},
	}
	markKey := []attr{
		{Type: svcAF, Value: ne16(unix.AF_INET6)},
		{Type: svcFWMark, Value: ne32(0x10000)},
	}
	settings := func(sched string, flags, timeout, netmask uint32) []attr {
		return []attr{
			{Type: svcSchedName, Value: append([]byte(sched), 0)},
			{Type: svcFlags, Value: append(ne32(flags), 0xff, 0xff, 0xff, 0xff)},
			{Type: svcTimeout, Value: ne32(timeout)},
			{Type: svcNetmask, Value: ne32(netmask)},
		}
	}
	dest := []attr{
		{Type: destAddr, Value: []byte{10, 244, 1, 2}},
		{Type: destPort, Value: be16(8080)},
	}
	want := []message{
		{typ: 0x1d, flags: unix.NLM_F_REQUEST, cmd: cmdNewService, attrs: []attr{
			{Type: attrService, Nested: slices.Concat(svcKey, settings("wrr", FlagPersistent, 10800, 0xffffffff))}}},
		{typ: 0x1d, flags: unix.NLM_F_REQUEST, cmd: cmdSetService, attrs: []attr{
			{Type: attrService, Nested: slices.Concat(markKey, settings("mh", FlagSched2, 0, 128))}}},
		{typ: 0x1d, flags: unix.NLM_F_REQUEST, cmd: cmdNewDest, attrs: []attr{
			{Type: attrService, Nested: svcKey},
			{Type: attrDest, Nested: slices.Concat(dest, []attr{
				{Type: destFwdMethod, Value: ne32(Masquerade)},
				{Type: destWeight, Value: ne32(3)},
				{Type: destUThresh, Value: ne32(0)},
				{Type: destLThresh, Value: ne32(0)},
				{Type: destAddrFamily, Value: ne16(unix.AF_INET)},
			})}}},
		{typ: 0x1d, flags: unix.NLM_F_REQUEST, cmd: cmdDelDest, attrs: []attr{
			{Type: attrService, Nested: svcKey},
			{Type: attrDest, Nested: append(dest, attr{Type: destAddrFamily, Value: ne16(unix.AF_INET)})}}},
		{typ: 0x1d, flags: unix.NLM_F_REQUEST, cmd: cmdDelService, attrs: []attr{
			{Type: attrService, Nested: markKey}}},
	}
	assert.Equal(t, want, messages(t, b))
}

// TestParse reads services and real servers as the kernel dumps them:
// addresses in a 16-byte union, statistics nests aside.
func TestParse(t *testing.T) {
	var k nl.Batch
	k.Message(0x1d, 0, cmdNewService, version, 0, 0)
	k.Nest(attrService)
	k.Uint16(svcAF, unix.AF_INET)
	k.Uint16(svcProtocol, unix.IPPROTO_UDP)
	k.Attr(svcAddr, []byte{10, 96, 0, 53, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	k.BigEndian16(svcPort, 53)
	k.String(svcSchedName, "rr")
	k.Attr(svcFlags, append(ne32(FlagPersistent), 0xff, 0xff, 0xff, 0xff))
	k.Uint32(svcTimeout, 60)
	k.Uint32(svcNetmask, 0xffffffff)
	k.Nest(10) // IPVS_SVC_ATTR_STATS
	k.Uint32(1, 5)
	k.End()
	k.End()
	b := k.Wire()
	var got Service
	for typ, v := range commandAttrs(b[16:]) {
		if typ == attrService {
			got = parseService(v)
		}
	}
	assert.Equal(t, Service{Family: unix.AF_INET, Protocol: unix.IPPROTO_UDP, Addr: netip.MustParseAddr("10.96.0.53"),
		Port: 53, Scheduler: "rr", Flags: FlagPersistent, Timeout: 60, Netmask: 0xffffffff}, got)

	var d nl.Batch
	d.Message(0x1d, 0, cmdNewDest, version, 0, 0)
	d.Nest(attrDest)
	v6 := netip.MustParseAddr("fd00::2").As16()
	d.Attr(destAddr, v6[:])
	d.BigEndian16(destPort, 8080)
	d.Uint32(destWeight, 0)
	d.Uint32(destActiveConns, 4)
	d.Uint32(destInactConns, 2)
	d.Uint16(destAddrFamily, unix.AF_INET6)
	d.End()
	b = d.Wire()
	var dest Dest
	for typ, v := range commandAttrs(b[16:]) {
		if typ == attrDest {
			dest = parseDest(v, unix.AF_INET)
		}
	}
	assert.Equal(t, Dest{Addr: netip.MustParseAddr("fd00::2"), Port: 8080, ActiveConns: 4, InactiveConns: 2}, dest)
}
