//go:build linux

package nfnl

import (
	"encoding/binary"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/nftables/expr"
)

// messages splits a batch's buffer (without the reserved room) back into
// messages.
func messagesOf(t *testing.T, b *Batch) []message {
	t.Helper()
	ms, err := splitMessages(b.enc.b[batchReserve:])
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestBatchDescribesMessages(t *testing.T) {
	var b Batch
	b.AddTable(Table{Family: Inet, Name: "kproxy"})
	b.AddChain(Chain{Family: Inet, Table: "kproxy", Name: "services"})
	b.AddRule(Rule{Family: Inet, Table: "kproxy", Chain: "services", Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	b.DelRule(Inet, "kproxy", "services", 7)
	b.FlushSet(IPv4, "nat", "s")
	b.ReplaceRule(Rule{Family: Inet, Table: "kproxy", Chain: "services", Handle: 9, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
	b.AddElements(IPv4, "nat", "s", []Element{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}}})
	b.DelElements(IPv4, "nat", "s", []Element{{Key: []byte{10, 0, 0, 1}}})
	want := strings.Join([]string{
		"add table inet kproxy",
		"add chain inet kproxy services",
		"add rule inet kproxy services",
		"delete rule inet kproxy services (handle 7)",
		"flush set ip nat s",
		"replace rule inet kproxy services (handle 9)",
		"add elements ip nat s (2 elements)",
		"delete elements ip nat s (1 element)",
		"",
	}, "\n")
	if got := b.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
	if b.Len() != 8 || len(messagesOf(t, &b)) != 8 {
		t.Errorf("Len() = %d, want 8 messages", b.Len())
	}
	// A batch of hundreds of thousands of messages keeps a record of
	// each: a small one.
	if size := unsafe.Sizeof(op{}); size > 48 {
		t.Errorf("a message's record takes %d bytes", size)
	}
	if got := b.Describe(9); got != "message 9" {
		t.Errorf("Describe(9) = %q", got)
	}
	if b.Err() != nil {
		t.Errorf("Err() = %v", b.Err())
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
		_, as, err := payload(m.data)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.typ != attrElemListElems {
				continue
			}
			if len(a.data) > maxAttrLen {
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
		ms, err := splitMessages(p)
		if err != nil {
			t.Fatal(err)
		}
		b.unframe()
		if len(ms) != 4 || ms[0].typ != msgBatchBegin || ms[3].typ != msgBatchEnd {
			t.Fatalf("framed batch = %+v", ms)
		}
		for i, m := range ms {
			if m.seq != 100+uint32(i) {
				t.Errorf("message %d has seq %d, want %d", i, m.seq, 100+i)
			}
		}
		_, as, _ := payload(ms[0].data)
		if check != (len(as) == 1 && as[0].typ == attrBatchGen && binary.BigEndian.Uint32(as[0].data) == 42) {
			t.Errorf("check=%v: batch begin attributes %+v", check, as)
		}
		if b.Size() != len(b.enc.b)-batchReserve {
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
