//go:build linux && !vm

// The guest of the VM tests has no strace.

package userspace

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// helperEnv, when set in the environment of this test binary, makes
// TestSpliceUnderStrace run the proxy alone, connected to the sink the
// variable names, until its standard input ends.
const helperEnv = "KPROXY_USERSPACE_STRACE_SINK"

// TestSpliceUnderStrace: the bytes of a TCP stream cross the proxy by
// splice(2), never through its memory: the proxy runs in a process of its
// own under strace, a 256 MiB stream crosses it, and strace counts the
// proxy's system calls: splices, and no more reads and writes of any kind
// than the process makes without the stream (where copying would cost
// one of each per 64 KiB at best). It needs strace: it is skipped without
// it, and fails under CI=true.
func TestSpliceUnderStrace(t *testing.T) {
	if sink := os.Getenv(helperEnv); sink != "" {
		runStraceHelper(t, sink)
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatal("strace is not installed (apt-get install strace)")
		}
		t.Skip("strace is not installed")
	}
	const size = 256 << 20
	sink := startCountingSink(t)
	out := filepath.Join(t.TempDir(), "strace.txt")
	cmd := exec.Command(strace, "-f", "-c", "-o", out,
		"-e", "trace=splice,read,write,readv,writev,pread64,pwrite64,recvfrom,sendto,recvmsg,sendmsg,recvmmsg,sendmmsg",
		os.Args[0], "-test.run=^TestSpliceUnderStrace$")
	cmd.Env = append(os.Environ(), helperEnv+"="+sink.String())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the proxy did not start")
	at, err := netip.ParseAddrPort(strings.TrimSpace(strings.TrimPrefix(line, "listening ")))
	require.NoError(t, err, "%q", line)

	c, err := net.Dial("tcp", at.String())
	require.NoError(t, err)
	buf := make([]byte, 1<<20)
	for sent := 0; sent < size; sent += len(buf) {
		_, err := c.Write(buf)
		require.NoError(t, err)
	}
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	reply, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(size), string(reply), "the sink's count")
	c.Close()
	stdin.Close()
	go io.Copy(io.Discard, stdout)
	require.NoError(t, cmd.Wait())

	calls := straceCounts(t, out)
	t.Logf("the proxy's system calls for a %d MiB stream: %v", size>>20, calls)
	copies := 0
	for name, n := range calls {
		if name != "splice" {
			copies += n
		}
	}
	assert.GreaterOrEqual(t, calls["splice"], 2*size/maxSplice, "too few splices for the stream")
	assert.Less(t, copies, 100, "the stream went through the proxy's memory (reads and writes)")
}

// runStraceHelper runs a proxy in front of sink on loopback, says where
// it listens, and serves until its standard input ends.
func runStraceHelper(t *testing.T, sink string) {
	w := &world{real: map[netip.AddrPort]netip.AddrPort{netip.AddrPortFrom(epAddr(0), tcpTarget): netip.MustParseAddrPort(sink)},
		listen: map[servicelb.ServicePortKey]netip.AddrPort{}}
	p := newProxier(t, w, Options{})
	s := service(1, ep(0))
	s.Ports = s.Ports[:1]
	require.NoError(t, servicetest.SyncErr(p.Sync(context.Background(), mustState(t, servicelb.NodeConfig{}, s))))
	os.Stdout.WriteString("listening " + w.at(key(1, "tcp")).String() + "\n")
	io.Copy(io.Discard, os.Stdin)
}

// startCountingSink reads each connection to its end and answers with
// the number of bytes read.
func startCountingSink(t *testing.T) netip.AddrPort {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	netnstest.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		n, err := io.Copy(io.Discard, c)
		if err == nil {
			io.WriteString(c, strconv.FormatInt(n, 10))
		}
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// straceCounts reads the calls per system call of a strace -c summary.
func straceCounts(t *testing.T, file string) map[string]int {
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	out := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[len(f)-1] == "total" || f[len(f)-1] == "syscall" {
			continue
		}
		if n, err := strconv.Atoi(f[3]); err == nil {
			out[f[len(f)-1]] = n
		}
	}
	return out
}
