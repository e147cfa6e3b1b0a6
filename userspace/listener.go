//go:build linux

package userspace

import (
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// listenKey is where a listener listens.
type listenKey struct {
	proto servicelb.Protocol
	at    netip.AddrPort
}

func (k listenKey) String() string { return fmt.Sprintf("%s %s", k.proto.Lower(), k.at) }

// binding is what a listener serves: a frontend of a kind of a service
// port. A sync may point a listener at another service port without
// closing it.
type binding struct {
	port *portState
	kind servicelb.FrontendKind
}

// listener is one listening socket (a bound one, for UDP) and the
// goroutine that serves it.
type listener struct {
	key     listenKey
	f       *os.File
	rc      syscall.RawConn
	binding atomic.Pointer[binding]
	// done is closed when the serving goroutine has returned; stop when
	// the listener is being closed.
	done, stop chan struct{}
	// broken is set when the goroutine ended on an error other than the
	// close: the next sync opens the listener again.
	broken atomic.Bool
	// udp holds the sessions of a UDP listener.
	udp *sessions
}

// open opens a listener at k serving b on socket fd (or its error), and
// starts its goroutine.
func (p *Proxier) open(k listenKey, b *binding, fd int, err error) (*listener, error) {
	f, err := listen(fd, err, k.proto, k.at)
	if err != nil {
		return nil, err
	}
	return p.start(k, b, f)
}

// start serves b on f, a socket listening (bound, for UDP) at k.
func (p *Proxier) start(k listenKey, b *binding, f *os.File) (*listener, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, &ListenError{Protocol: k.proto, At: k.at.String(), Err: err}
	}
	l := &listener{key: k, f: f, rc: rc, done: make(chan struct{}), stop: make(chan struct{})}
	l.binding.Store(b)
	p.wg.Add(1)
	if k.proto == servicelb.UDP {
		l.udp = newSessions()
		go p.udpLoop(l)
	} else {
		go p.acceptLoop(l)
	}
	return l, nil
}

// close closes the listener, waits for its goroutine, and ends its UDP
// sessions. Connections it accepted go on.
func (l *listener) close() {
	close(l.stop)
	l.f.Close()
	<-l.done
	if l.udp != nil {
		l.udp.closeAll()
	}
}

// sleep waits d, or until the listener is closed: false then.
func (l *listener) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.stop:
		return false
	}
}
