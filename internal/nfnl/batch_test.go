//go:build linux

package nfnl

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// messages splits a batch's buffer (without the reserved room) back into
// messages.
func messagesOf(t *testing.T, b *Batch) []nl.Message {
	t.Helper()
	ms, err := nl.Split(slices.Concat(append(b.chunks, b.enc.b)...)[batchReserve:])
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestBatchDescribesMessages(t *testing.T) {
	var b Batch
	accept := VerdictAccept
	b.AddTable(Table{Family: Inet, Name: "kproxy"})
	b.AddChain(Chain{Family: Inet, Table: "kproxy", Name: "services"})
	b.AddChain(Chain{Family: IPv4, Table: "nat", Name: "PREROUTING", Hook: &Hook{Num: HookPrerouting, Priority: -100, Type: "nat", Policy: &accept}})
	b.AddRule(Rule{Family: Inet, Table: "kproxy", Chain: "services", Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	b.InsertRule(Rule{Family: Inet, Table: "kproxy", Chain: "services", Position: 3, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
	b.ReplaceRule(Rule{Family: IPv6, Table: "filter", Chain: "INPUT", Handle: 12, Raw: []RawExpr{{Name: "counter"}}})
	b.DelRule(Inet, "kproxy", "services", 7)
	b.FlushChain(IPv4, "nat", "KUBE-SVC-X")
	b.FlushTable(Inet, "kproxy")
	b.DelChain(IPv4, "nat", "KUBE-SEP-Y")
	b.AddSet(Set{Family: Inet, Table: "kproxy", Name: "services4", KeyType: 7, KeyLen: 4})
	b.AddElements(Inet, "kproxy", "services4", []Element{{Key: []byte{1, 2, 3, 4}}, {Key: []byte{1, 2, 3, 5}}})
	b.DelElements(Inet, "kproxy", "services4", []Element{{Key: []byte{1, 2, 3, 4}}})
	b.FlushSet(IPv4, "nat", "s")
	b.DelSet(Inet, "kproxy", "services4")
	b.DelTable(IPv6, "kproxy")
	want := strings.Join([]string{
		"add table inet kproxy",
		"add chain inet kproxy services",
		"add chain ip nat PREROUTING",
		"add rule inet kproxy services",
		"insert rule inet kproxy services",
		"replace rule ip6 filter INPUT (handle 12)",
		"delete rule inet kproxy services (handle 7)",
		"flush chain ip nat KUBE-SVC-X",
		"flush table inet kproxy",
		"delete chain ip nat KUBE-SEP-Y",
		"add set inet kproxy services4",
		"add elements inet kproxy services4 (2 elements)",
		"delete elements inet kproxy services4 (1 element)",
		"flush set ip nat s",
		"delete set inet kproxy services4",
		"delete table ip6 kproxy",
		"",
	}, "\n")
	if got := b.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
	if b.Len() != 16 || len(messagesOf(t, &b)) != 16 {
		t.Errorf("Len() = %d, want 16 messages", b.Len())
	}
	if got := b.Describe(16); got != "message 16" {
		t.Errorf("Describe(16) = %q", got)
	}
	if b.Err() != nil {
		t.Errorf("Err() = %v", b.Err())
	}
}

// A batch of a large ruleset holds hundreds of thousands of messages: its
// record of them costs a few bytes each beyond the messages' own bytes
// (and the headroom of the chunk that holds them).
func TestBatchRecordsMessagesCheaply(t *testing.T) {
	const n = 10000
	build := func() *Batch {
		b := &Batch{}
		b.GrowMessages(n)
		b.Grow(n * 60) // the size of these messages
		for i := range n {
			b.DelRule(IPv4, "nat", "KUBE-SERVICES", uint64(i+1))
		}
		return b
	}
	var b *Batch
	allocated := testing.AllocsPerRun(1, func() { b = build() })
	if allocated > 8 {
		t.Errorf("%v allocations for %d messages, want a handful", allocated, n)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b = build()
	runtime.ReadMemStats(&after)
	if extra := int(after.TotalAlloc-before.TotalAlloc) - b.Size() - chunkHeadroom; extra > 16*n {
		t.Errorf("%d bytes allocated beyond the %d bytes of %d messages, want at most 16 a message", extra, b.Size(), n)
	}
	if got := b.Describe(n - 1); got != fmt.Sprintf("delete rule ip nat KUBE-SERVICES (handle %d)", n) {
		t.Errorf("Describe(%d) = %q", n-1, got)
	}
}

// A batch built without hints grows its record of messages by doubling,
// not by the quarter append adds to a large slice (which copies it many
// times over): with its chunks' headroom, it costs some 24 bytes a
// message beyond the messages' own bytes, not 52.
func TestBatchRecordGrowsCheaply(t *testing.T) {
	const n = 300000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var b Batch
	for i := range n {
		b.DelRule(IPv4, "nat", "KUBE-SERVICES", uint64(i+1))
	}
	runtime.ReadMemStats(&after)
	perMessage := float64(int(after.TotalAlloc-before.TotalAlloc)-b.Size()) / n
	t.Logf("%.1f bytes a message beyond its %d", perMessage, b.Size()/n)
	if perMessage > 32 {
		t.Errorf("%.1f bytes allocated a message beyond the messages' own, want at most 32", perMessage)
	}
}

// A large batch grows chunk by chunk instead of being copied whole as it
// grows, and goes out as those chunks, each message whole in one of them,
// numbered in order; messages in any chunk can be described and echoed.
func TestLargeBatchGrowsByChunks(t *testing.T) {
	const n = 40000
	raw := []RawExpr{{Name: "counter", Data: make([]byte, 300)}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var b Batch
	for i := range n {
		b.AddRule(Rule{Family: IPv4, Table: "nat", Chain: fmt.Sprintf("KUBE-SEP-%d", i), Raw: raw})
	}
	runtime.ReadMemStats(&after)
	size := b.Size()
	if size < 8*chunkSize {
		t.Fatalf("batch of %d bytes is too small for this test", size)
	}
	if alloc := int(after.TotalAlloc - before.TotalAlloc); alloc > size*3/2 {
		t.Errorf("%d bytes allocated for a batch of %d bytes, want at most 1.5 times its size", alloc, size)
	}
	b.Echo(n - 1)
	if got, want := b.Describe(n-1), fmt.Sprintf("add rule ip nat KUBE-SEP-%d", n-1); got != want {
		t.Errorf("Describe(%d) = %q, want %q", n-1, got, want)
	}
	bufs := b.frame(100)
	if len(bufs) < 8 {
		t.Errorf("%d buffers for %d bytes, want one a chunk", len(bufs), size)
	}
	var ms []nl.Message
	for _, p := range bufs {
		if len(p) > chunkSize+chunkHeadroom+nl.HeaderLen+nfgenLen {
			t.Errorf("buffer of %d bytes", len(p))
		}
		got, err := nl.Split(p) // no message spans two buffers
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, got...)
	}
	b.unframe()
	if len(ms) != n+2 || ms[0].Type != msgBatchBegin || ms[n+1].Type != msgBatchEnd {
		t.Fatalf("%d messages framed, want %d", len(ms), n+2)
	}
	for i, m := range ms {
		if m.Seq != 100+uint32(i) {
			t.Fatalf("message %d has seq %d", i, m.Seq)
		}
		if echo := m.Flags&nl.Echo != 0; echo != (i == n) {
			t.Errorf("message %d: echo flag %v", i, echo)
		}
	}
}

// A rule's expressions encoded elsewhere (Rule.Encoded) make the same
// message as the same expressions given one by one (Rule.Raw).
func TestRuleEncoded(t *testing.T) {
	exprs := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "KUBE-SVC-X"}}
	raw, err := EncodeExprs(IPv4, exprs)
	if err != nil {
		t.Fatal(err)
	}
	var byRaw, byExprs Batch
	byRaw.AddRule(Rule{Family: IPv4, Table: "nat", Chain: "KUBE-SERVICES", Raw: raw, Compat: &Compat{Proto: 6}})
	byExprs.AddRule(Rule{Family: IPv4, Table: "nat", Chain: "KUBE-SERVICES", Exprs: exprs, Compat: &Compat{Proto: 6}})
	var list []byte
	for _, x := range raw {
		var e encoder
		n := e.nest(attrListElem)
		e.str(attrExprName, x.Name)
		e.attr(attrExprData|nl.Nested, x.Data)
		e.endNest(n)
		list = append(list, e.b...)
	}
	var byEncoded Batch
	byEncoded.AddRule(Rule{Family: IPv4, Table: "nat", Chain: "KUBE-SERVICES", Encoded: list, Compat: &Compat{Proto: 6}})
	want := messagesOf(t, &byRaw)
	for name, b := range map[string]*Batch{"Exprs": &byExprs, "Encoded": &byEncoded} {
		if got := messagesOf(t, b); len(got) != 1 || string(got[0].Data) != string(want[0].Data) {
			t.Errorf("rule written from %s differs from the rule written from Raw", name)
		}
	}
}

func TestBatchKeepsFirstMistake(t *testing.T) {
	var b Batch
	b.AddTable(Table{Family: Inet, Name: strings.Repeat("x", 70000)})
	b.AddTable(Table{Family: Inet, Name: "fine"})
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "at most 65535") {
		t.Errorf("Err() = %v, want an oversized attribute error", err)
	}
}

func TestElementsSplitAcrossMessages(t *testing.T) {
	var b Batch
	els := make([]Element, 5000)
	for i := range els {
		els[i].Key = []byte{10, 0, byte(i >> 8), byte(i)}
		els[i].Data = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	}
	b.AddElements(Inet, "t", "m", els)
	ms := messagesOf(t, &b)
	if len(ms) < 2 {
		t.Fatalf("%d messages for 5000 elements, want several", len(ms))
	}
	total := 0
	for _, m := range ms {
		_, as, err := payload(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.typ != attrElemListElems {
				continue
			}
			if len(a.data) > nl.MaxAttrLen {
				t.Fatalf("element list of %d bytes", len(a.data))
			}
			list, err := attributes(a.data)
			if err != nil {
				t.Fatal(err)
			}
			total += len(list)
		}
	}
	if total != len(els) {
		t.Errorf("%d elements encoded, want %d", total, len(els))
	}
	if b.Err() != nil {
		t.Fatal(b.Err())
	}
}

func TestFrameNumbersMessages(t *testing.T) {
	var b Batch
	b.AddTable(Table{Family: Inet, Name: "a"})
	b.AddTable(Table{Family: Inet, Name: "b"})
	for _, check := range []bool{false, true} {
		b.check, b.genID = check, 42
		p := b.frame(100)
		ms, err := nl.Split(slices.Concat(p...))
		if err != nil {
			t.Fatal(err)
		}
		b.unframe()
		if len(ms) != 4 || ms[0].Type != msgBatchBegin || ms[3].Type != msgBatchEnd {
			t.Fatalf("framed batch = %+v", ms)
		}
		for i, m := range ms {
			if m.Seq != 100+uint32(i) {
				t.Errorf("message %d has seq %d, want %d", i, m.Seq, 100+i)
			}
		}
		_, as, _ := payload(ms[0].Data)
		if check != (len(as) == 1 && as[0].typ == attrBatchGen && binary.BigEndian.Uint32(as[0].data) == 42) {
			t.Errorf("check=%v: batch begin attributes %+v", check, as)
		}
		if b.Size() != b.sealed+len(b.enc.b)-batchReserve {
			t.Errorf("unframe left %d bytes", len(b.enc.b))
		}
	}
}

func TestDecodeByteorder(t *testing.T) {
	want := &expr.Byteorder{SourceRegister: 9, DestRegister: 9, Op: expr.ByteorderHton, Len: 1, Size: 2}
	raw, err := EncodeExprs(Inet, []expr.Any{want})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeExpr(Inet, raw[0])
	if err != nil {
		t.Fatal(err)
	}
	if *got.(*expr.Byteorder) != *want {
		t.Errorf("decoded %+v, want %+v", got, want)
	}
	if !SameExprs(Inet, raw, []expr.Any{want}) {
		t.Error("SameExprs does not match an encoded byteorder with itself")
	}
}
