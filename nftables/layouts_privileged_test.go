//go:build privileged

package nftables_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The kernel's cost of a one-endpoint change under candidate layouts of
// the table, measured before a layout is built: each candidate is loaded
// at 1k x 10 and at 50k x 5 in namespaces of their own, and a change (an
// endpoint replaced, and put back, again and again) is timed commit by
// commit; the medians are set beside the cheapest element commit of the
// same namespace (floorMedian). Only the kernel's share is measured: the
// batches are built before the clock starts.
//
//   - proxier: the table as this package writes it (when these were
//     first measured, a chain per service port; since, flat, with set
//     dispatch); the change is the batch its Proxier sends.
//   - flat: no chain per port. services4 sends every frontend to one
//     shared chain for its verdicts; there, one rule per number of
//     buckets B in use picks the frontends of B buckets (a set each) and
//     translates through one hash map keyed by frontend and bucket
//     (numgen random mod B). The change replaces one element's data.
//   - flat-verdict: the same table; the change moves one frontend's
//     dispatch to another shared chain (a verdict element replaced), as
//     a change of a port's verdicts would.
//   - flat-sets: flat, with the dispatch made by one rule per shared chain
//     that matches a set of the frontends it serves, instead of a verdict
//     map; the change adds a service of k endpoints (its frontend in two
//     sets, its k endpoint elements) and deletes it again.

type layoutSize struct {
	name string
	n, k int
}

var layoutSizes = []layoutSize{{"1k-x-10", 1000, 10}, {"50k-x-5", 50000, 5}}

// layoutChange is a layout loaded in a namespace, with the two batches of
// its change (forward, back) and a connection to commit them.
type layoutChange struct {
	h    *netnstest.Host
	conn *nfnl.Conn
	// commit makes the change (i even) or takes it back (i odd).
	commit func(ctx context.Context, i int) error
}

func BenchmarkLayouts(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	layouts := []struct {
		name string
		load func(b *testing.B, sz layoutSize) *layoutChange
	}{
		{"proxier", loadProxier},
		{"flat", func(b *testing.B, sz layoutSize) *layoutChange { return loadFlat(b, sz, false) }},
		{"flat-verdict", func(b *testing.B, sz layoutSize) *layoutChange { return loadFlat(b, sz, true) }},
		{"flat-sets", loadFlatSets},
	}
	for _, l := range layouts {
		b.Run(l.name, func(b *testing.B) {
			small, large := l.load(b, layoutSizes[0]), l.load(b, layoutSizes[1])
			ctx := context.Background()
			var ts, tl []time.Duration
			step := func(c *layoutChange, i int) time.Duration {
				t0 := time.Now()
				if err := c.commit(ctx, i); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			b.ResetTimer()
			for i := range b.N {
				// Both directions each turn, so that every
				// iteration leaves the table as it found it.
				ts = append(ts, step(small, 2*i), step(small, 2*i+1))
				tl = append(tl, step(large, 2*i), step(large, 2*i+1))
			}
			b.StopTimer()
			fs, fl := floorMedian(b, small.conn, max(b.N, 100)), floorMedian(b, large.conn, max(b.N, 100))
			as, al := medianDuration(ts), medianDuration(tl)
			b.ReportMetric(float64(as.Nanoseconds())/1000, "small-us/change")
			b.ReportMetric(float64(al.Nanoseconds())/1000, "large-us/change")
			b.ReportMetric(float64(al)/float64(as), "large/small")
			b.ReportMetric(float64(fs.Nanoseconds())/1000, "small-floor-us")
			b.ReportMetric(float64(fl.Nanoseconds())/1000, "large-floor-us")
			b.ReportMetric(float64(al)/float64(fl), "large/floor")
			b.ReportMetric(float64(as)/float64(fs), "small/floor")
		})
	}
}

func medianDuration(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// floorMedian is the median time of the cheapest element commit of the
// connection's namespace (elementCommits).
func floorMedian(b *testing.B, conn *nfnl.Conn, n int) time.Duration {
	return medianDuration(elementCommits(b, conn, n))
}

func openConn(b *testing.B, h *netnstest.Host) *nfnl.Conn {
	conn, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// loadProxier syncs the services with a Proxier and keeps the batches of
// one endpoint replaced in the middle service and put back.
func loadProxier(b *testing.B, sz layoutSize) *layoutChange {
	h := netnstest.NewHost(b, "layout")
	svcs := benchServices(sz.n, sz.k)
	a, err := servicelb.NewState(benchNode(), svcs...)
	if err != nil {
		b.Fatal(err)
	}
	ed := a.Edit()
	if err := ed.Upsert(servicetest.ReplaceEndpoint(svcs[sz.n/2], 1)); err != nil {
		b.Fatal(err)
	}
	c := ed.State()
	p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	ctx := context.Background()
	if err := servicetest.SyncErr(p.Sync(ctx, a)); err != nil {
		b.Fatal(err)
	}
	var frames [2][][]byte
	for i, st := range []*servicelb.State{c, a} {
		tctx := nfnl.WithTap(ctx, func(f []byte) { frames[i] = append(frames[i], slices.Clone(f)) })
		if err := servicetest.SyncErr(p.Sync(tctx, st)); err != nil {
			b.Fatal(err)
		}
	}
	conn := openConn(b, h)
	return &layoutChange{h: h, conn: conn, commit: func(ctx context.Context, i int) error {
		for _, f := range frames[i%2] {
			if err := conn.Replay(ctx, f); err != nil {
				return err
			}
		}
		return nil
	}}
}

// loadFlat loads the flat candidate with nft and keeps its change: one
// endpoint element's data replaced, or with verdict one frontend's
// dispatch moved to another shared chain.
func loadFlat(b *testing.B, sz layoutSize, verdict bool) *layoutChange {
	h := netnstest.NewHost(b, "layout")
	h.ExecInput(b, flatTable(benchServices(sz.n, sz.k), sz.k, false, 0), "nft", "-f", "-")
	conn := openConn(b, h)
	ctx := context.Background()
	const table = "flat"
	if verdict {
		els, err := conn.Elements(ctx, nfnl.Inet, table, "services4")
		if err != nil {
			b.Fatal(err)
		}
		el := els[len(els)/2]
		moved := el
		moved.Verdict = &nfnl.Verdict{Code: el.Verdict.Code, Chain: "cluster-b"}
		return replacing(h, conn, table, "services4", moved, el)
	}
	els, err := conn.Elements(ctx, nfnl.Inet, table, "eps4")
	if err != nil {
		b.Fatal(err)
	}
	el, other := els[len(els)/2], els[len(els)/2+1]
	replaced := el
	replaced.Data = other.Data
	return replacing(h, conn, table, "eps4", replaced, el)
}

// replacing is the change that replaces an element of set with changed
// (i even) and puts it back as it was (i odd), in one commit each.
func replacing(h *netnstest.Host, conn *nfnl.Conn, table, set string, changed, was nfnl.Element) *layoutChange {
	pair := [2]nfnl.Element{changed, was}
	return &layoutChange{h: h, conn: conn, commit: func(ctx context.Context, i int) error {
		var bt nfnl.Batch
		bt.DelElements(nfnl.Inet, table, set, []nfnl.Element{{Key: was.Key}})
		bt.AddElements(nfnl.Inet, table, set, []nfnl.Element{pair[i%2]})
		_, err := conn.Commit(ctx, &bt)
		return err
	}}
}

// loadFlatSets loads the flat candidate with the dispatch by sets and
// keeps the change that adds a service and the one that deletes it.
func loadFlatSets(b *testing.B, sz layoutSize) *layoutChange {
	h := netnstest.NewHost(b, "layout")
	h.ExecInput(b, flatTable(benchServices(sz.n, sz.k), sz.k, true, 0), "nft", "-f", "-")
	conn := openConn(b, h)
	ctx := context.Background()
	const table = "flat"
	// The elements of a service as the kernel holds them: those of the
	// first service, with its cluster IP replaced by one no service has.
	sets := []string{"frontends-cluster4", fmt.Sprintf("buckets%d-4", sz.k), "eps4"}
	first := benchServices(1, sz.k)[0].ClusterIPs[0].As4()
	added := map[string][]nfnl.Element{}
	for _, set := range sets {
		els, err := conn.Elements(ctx, nfnl.Inet, table, set)
		if err != nil {
			b.Fatal(err)
		}
		for _, el := range els {
			if [4]byte(el.Key[:4]) == first {
				el.Key = slices.Clone(el.Key)
				copy(el.Key, []byte{172, 31, 255, 1})
				added[set] = append(added[set], el)
			}
		}
		if len(added[set]) == 0 {
			b.Fatalf("no element of %s in %s", benchServices(1, sz.k)[0].Name, set)
		}
	}
	return &layoutChange{h: h, conn: conn, commit: func(ctx context.Context, i int) error {
		var bt nfnl.Batch
		for _, set := range sets {
			if i%2 == 0 {
				bt.AddElements(nfnl.Inet, table, set, added[set])
			} else {
				bt.DelElements(nfnl.Inet, table, set, added[set])
			}
		}
		_, err := conn.Commit(ctx, &bt)
		return err
	}}
}

// flatTable renders the flat candidate for services of one TCP port and
// k endpoints each, dispatched by a verdict map or, with bySets, by a set
// of the frontends of each shared chain. With decoys, every frontend is
// matched after as many rules that dispatch other shared chains and as
// many that pick other numbers of buckets, each reading a set of its own.
func flatTable(svcs []servicelb.Service, k int, bySets bool, decoys int) string {
	var s strings.Builder
	s.WriteString("table inet flat {\n")
	fmt.Fprintf(&s, "\tmap eps4 {\n\t\ttypeof ip daddr . meta l4proto . th dport . numgen random mod %d : ip daddr . th dport\n\t\telements = {\n", k)
	for _, svc := range svcs {
		for j, ep := range svc.Endpoints {
			fmt.Fprintf(&s, "\t\t\t%s . tcp . 80 . %d : %s . 8080,\n", svc.ClusterIPs[0], j, ep.Addr)
		}
	}
	s.WriteString("\t\t}\n\t}\n")
	fmt.Fprintf(&s, "\tset buckets%d-4 {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = {\n", k)
	for _, svc := range svcs {
		fmt.Fprintf(&s, "\t\t\t%s . tcp . 80,\n", svc.ClusterIPs[0])
	}
	s.WriteString("\t\t}\n\t}\n")
	dispatch := "\t\tip daddr . meta l4proto . th dport vmap @services4\n"
	if bySets {
		s.WriteString("\tset frontends-cluster4 {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = {\n")
		for _, svc := range svcs {
			fmt.Fprintf(&s, "\t\t\t%s . tcp . 80,\n", svc.ClusterIPs[0])
		}
		s.WriteString("\t\t}\n\t}\n")
		s.WriteString("\tset frontends-cluster-b4 {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t}\n")
		dispatch = ""
		for i := range decoys {
			fmt.Fprintf(&s, "\tset frontends-decoy%d-4 {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = { 192.0.2.%d . tcp . 80 }\n\t}\n", i, i)
			dispatch += fmt.Sprintf("\t\tip daddr . meta l4proto . th dport @frontends-decoy%d-4 goto cluster-b\n", i)
		}
		dispatch += "\t\tip daddr . meta l4proto . th dport @frontends-cluster4 goto cluster\n" +
			"\t\tip daddr . meta l4proto . th dport @frontends-cluster-b4 goto cluster-b\n"
	} else {
		s.WriteString("\tmap services4 {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = {\n")
		for _, svc := range svcs {
			fmt.Fprintf(&s, "\t\t\t%s . tcp . 80 : goto cluster,\n", svc.ClusterIPs[0])
		}
		s.WriteString("\t\t}\n\t}\n")
	}
	for i := range decoys {
		fmt.Fprintf(&s, "\tset buckets%d-4 {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = { 192.0.2.%d . tcp . 80 }\n\t}\n", 100+i, i)
	}
	for _, chain := range []string{"cluster", "cluster-b"} {
		fmt.Fprintf(&s, "\tchain %s {\n", chain)
		for i := range decoys {
			fmt.Fprintf(&s, "\t\tip daddr . meta l4proto . th dport @buckets%d-4 meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport . numgen random mod %d map @eps4\n", 100+i, k)
		}
		fmt.Fprintf(&s, "\t\tip daddr . meta l4proto . th dport @buckets%d-4 meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport . numgen random mod %d map @eps4\n", k, k)
		s.WriteString("\t\tdrop\n\t}\n")
	}
	s.WriteString("\tchain services {\n" + dispatch + "\t}\n")
	s.WriteString("\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n")
	s.WriteString("\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n")
	s.WriteString("}\n")
	return s.String()
}

// BenchmarkLayoutFirstPacket sets the data path through a service beside
// the direct path to its endpoint, from the node's own sockets (the
// output hook), at 1k services x 10 and at 50k x 5, under each candidate
// layout: the Proxier's; flat with one rule to the endpoint; and flat
// with set dispatch where the frontend is matched after 16 other shared
// chains' rules and 16 rules of other numbers of buckets (a node with
// that many verdict shapes and endpoint counts in use). Two measures: a
// new TCP connection's connect time (rounds of connects through the
// service and direct take turns, benchwork.ConnectBoth; medians), and
// the time of a 1 GiB stream (streams through the service and direct
// take turns, seven each; medians). Each is reported over the direct
// path's.
func BenchmarkLayoutFirstPacket(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	for _, sz := range layoutSizes {
		svcs := benchServices(sz.n, sz.k)
		target := svcs[sz.n/2]
		layouts := []struct {
			name string
			load func(h *netnstest.Host)
		}{
			{"proxier", func(h *netnstest.Host) {
				st, err := servicelb.NewState(benchNode(), svcs...)
				if err != nil {
					b.Fatal(err)
				}
				p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { p.Close() })
				if err := servicetest.SyncErr(p.Sync(context.Background(), st)); err != nil {
					b.Fatal(err)
				}
			}},
			{"flat", func(h *netnstest.Host) { h.ExecInput(b, flatTable(svcs, sz.k, false, 0), "nft", "-f", "-") }},
			{"flat-sets-16-decoys", func(h *netnstest.Host) { h.ExecInput(b, flatTable(svcs, sz.k, true, 16), "nft", "-f", "-") }},
		}
		for _, l := range layouts {
			b.Run(sz.name+"/"+l.name, func(b *testing.B) {
				h := netnstest.NewHost(b, "layout")
				l.load(h)
				for _, ep := range target.Endpoints {
					h.AddAddress(b, netip.PrefixFrom(ep.Addr, 32))
				}
				// A route to the service addresses, for the connect's
				// route lookup before the output hook translates it.
				h.Exec(b, "ip", "route", "add", "172.16.0.0/12", "dev", "lo")
				vip := netip.AddrPortFrom(target.ClusterIPs[0], 80).String()
				direct := netip.AddrPortFrom(target.Endpoints[0].Addr, 8080).String()
				var via, dir benchwork.Latency
				var streams [2][]time.Duration
				err := h.Do(func() error {
					ln, err := net.Listen("tcp4", ":8080")
					if err != nil {
						return err
					}
					defer ln.Close()
					netnstest.ServeConns(ln, func(c net.Conn) {
						_, _ = io.Copy(io.Discard, c)
						c.Close()
					})
					b.ResetTimer()
					via, dir, err = benchwork.ConnectBoth([]string{vip}, []string{direct}, b.N, 5*time.Second)
					b.StopTimer()
					if err != nil {
						return err
					}
					for range 7 {
						for i, to := range []string{vip, direct} {
							d, err := stream(to, 1<<30)
							if err != nil {
								return err
							}
							streams[i] = append(streams[i], d)
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(via.P50, "service-us")
				b.ReportMetric(dir.P50, "direct-us")
				b.ReportMetric(via.P50/dir.P50, "service/direct")
				sv, sd := medianDuration(streams[0]), medianDuration(streams[1])
				b.ReportMetric(float64(sv.Milliseconds()), "stream-service-ms")
				b.ReportMetric(float64(sd.Milliseconds()), "stream-direct-ms")
				b.ReportMetric(float64(sv)/float64(sd), "stream-service/direct")
			})
		}
	}
}

// stream sends n bytes to addr over one TCP connection and waits for the
// server to have read them all (its close after the client's): the time
// from the connect to the end.
func stream(addr string, n int) (time.Duration, error) {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}
