//go:build linux

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// staleSockets moves the connected UDP sockets whose flows are stale: a
// socket the hooks sent to an endpoint that no longer serves its frontend
// while others do (servicelb.StaleFlow). kube-proxy deletes such a flow's
// conntrack entry, so that the client's next datagram is translated
// afresh; a socket the hooks connected to the endpoint itself has no entry
// to delete, and would keep sending to the endpoint. So it is connected
// again to its frontend, through the hooks, as its owner would connect it:
// its next datagram goes to a serving endpoint, and its owner sees
// nothing (getpeername still names the frontend). Where the hooks refuse
// the frontend by then (no endpoint serves it any more), the socket is
// disconnected instead, so that it never sends to the endpoint that left:
// its owner's next send fails with EDESTADDRREQ. Unconnected sockets need
// none of this: each send meets the hooks (kp_udpflows).
//
// The sockets are found from the hooks' reverse translations (kp_revnat:
// socket cookie and endpoint to the frontend): only when one names a
// stale endpoint are the processes of the cgroup searched for the socket
// (see moveSockets). Everything is done through the socket's descriptor,
// taken from its process with pidfd_getfd (CAP_SYS_PTRACE): no network
// namespace is entered, so no CAP_SYS_ADMIN is needed.
type staleSockets Proxier

// DeleteStale implements conntrack.FlowCleaner for the syncer's Engine,
// which calls it after a sync with the stale-flow filters the sync left.
// It runs under the Proxier's lock.
func (s *staleSockets) DeleteStale(ctx context.Context, filters []servicelb.StaleFlow) (int, error) {
	p := (*Proxier)(s)
	if p.maps == nil {
		return 0, nil
	}
	stale, err := p.staleTranslations(filters)
	if err != nil || len(stale) == 0 {
		return 0, err
	}
	n, err := p.moveSockets(ctx, stale)
	if n.moved+n.disconnected > 0 {
		p.log.Info("connected UDP sockets whose endpoint stopped serving connected again",
			"moved", n.moved, "disconnected", n.disconnected)
	}
	return n.moved + n.disconnected, err
}

// staleTranslations returns the reverse translations (socket and
// endpoint) whose frontend is a UDP frontend of filters and whose
// endpoint does not serve it, with their frontends.
func (p *Proxier) staleTranslations(filters []servicelb.StaleFlow) (map[revKey]endpoint, error) {
	byFrontend := map[endpoint]*servicelb.StaleFlow{}
	for i, f := range filters {
		if f.Protocol == servicelb.UDP {
			byFrontend[newEndpoint(f.Dst, f.Port)] = &filters[i]
		}
	}
	if len(byFrontend) == 0 {
		return nil, nil
	}
	rev, err := readAll[revKey, endpoint](p.maps.reverse)
	if err != nil {
		return nil, err
	}
	stale := map[revKey]endpoint{}
	for k, fe := range rev {
		if f := byFrontend[fe]; f != nil && !f.Keeps(k.endpoint.AddrPort()) {
			stale[k] = fe
		}
	}
	return stale, nil
}

// moved counts the sockets moveSockets connected again, and those it
// disconnected.
type moved struct{ moved, disconnected int }

// moveSockets connects again to their frontend the connected UDP sockets
// whose cookie and peer are a key of stale. They are looked for among the
// descriptors of the cgroup's processes, by cookie; a process or socket
// that goes meanwhile is passed over.
//
// The peer must be the one the kernel holds, which getpeername shows only
// when the hooks have no reverse translation for it: so a socket's stale
// translations are deleted first (they translate for an endpoint that no
// longer serves), and a socket whose getpeername then names one of their
// endpoints is on it. Any other answer (the frontend, by a translation of
// the socket's current endpoint; an address of another service; ENOTCONN)
// is a socket its owner has connected elsewhere since, which stays as it
// is.
func (p *Proxier) moveSockets(ctx context.Context, stale map[revKey]endpoint) (moved, error) {
	byCookie := map[uint64][]revKey{}
	for k := range stale {
		byCookie[k.Cookie] = append(byCookie[k.Cookie], k)
	}
	var n moved
	pids, err := cgroupProcs(p.opts.Cgroup)
	if err != nil {
		return n, err
	}
	var blind error
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if pid == 0 {
			blind = errors.New("the cgroup holds processes of another PID namespace: run in the host's")
			continue
		}
		err := socketsOf(pid, byCookie, func(fd int, cookie uint64) error {
			for _, k := range byCookie[cookie] {
				if err := p.maps.reverse.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("delete a stale reverse translation: %w", err)
				}
			}
			sa, err := unix.Getpeername(fd)
			if err != nil {
				return nil // not connected
			}
			fe, ok := stale[revKey{Cookie: cookie, endpoint: newEndpoint(sockaddrAddrPort(sa))}]
			if !ok {
				return nil
			}
			if err := connectTo(fd, fe.AddrPort()); err == nil {
				n.moved++
				return nil
			}
			if err := disconnect(fd); err != nil {
				return fmt.Errorf("disconnect a socket of process %d: %w", pid, err)
			}
			n.disconnected++
			return nil
		})
		if err != nil {
			blind = err
		}
	}
	if blind != nil && !p.blindWarned {
		p.blindWarned = true
		p.log.Warn("some connected UDP sockets may stay with endpoints that stopped serving: "+
			"kproxy cannot look at every process's sockets", "err", blind)
	}
	return n, nil
}

// sockaddrAddrPort returns the address and port of an IPv4 or IPv6
// socket address (an IPv4-mapped one as IPv4), or zeros.
func sockaddrAddrPort(sa unix.Sockaddr) (netip.Addr, uint16) {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(sa.Addr), uint16(sa.Port)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port)
	}
	return netip.Addr{}, 0
}

// connectTo connects socket fd to a, through the hooks of the cgroup the
// socket was made in, whoever calls. An IPv4 address is given as such to
// an IPv6 socket too: the kernel runs the IPv4 hook for it, as for its
// owner's connect.
func connectTo(fd int, a netip.AddrPort) error {
	if a.Addr().Is4() {
		return unix.Connect(fd, &unix.SockaddrInet4{Addr: a.Addr().As4(), Port: int(a.Port())})
	}
	return unix.Connect(fd, &unix.SockaddrInet6{Addr: a.Addr().As16(), Port: int(a.Port())})
}

// disconnect dissolves socket fd's association with its peer, as a
// connect to AF_UNSPEC does.
func disconnect(fd int) error {
	sa := unix.RawSockaddrInet4{Family: unix.AF_UNSPEC}
	_, _, errno := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	if errno != 0 {
		return errno
	}
	return nil
}

// socketsOf calls f with a descriptor of each socket of process pid whose
// cookie is in cookies, a duplicate taken with pidfd_getfd that f must not
// keep. It fails only when it may not look at the process's descriptors
// (CAP_SYS_PTRACE) or f fails; a process or descriptor gone meanwhile is
// passed over.
func socketsOf[V any](pid int, cookies map[uint64]V, f func(fd int, cookie uint64) error) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return denied(pid, err)
	}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dup, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			if err := denied(pid, err); err != nil {
				return err
			}
			continue // closed meanwhile
		}
		cookie, err := unix.GetsockoptUint64(dup, unix.SOL_SOCKET, unix.SO_COOKIE)
		if _, ok := cookies[cookie]; err == nil && ok {
			err = f(dup, cookie)
		} else {
			err = nil
		}
		unix.Close(dup)
		if err != nil {
			return err
		}
	}
	return nil
}

// denied returns err about process pid when it refuses a permission,
// else nil.
func denied(pid int, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("descriptors of process %d: %w", pid, err)
	}
	return nil
}

// cgroupProcs lists the processes of the cgroup v2 directory dir and of
// the cgroups below it.
func cgroupProcs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != dir {
				return nil // a cgroup removed meanwhile
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != dir {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("processes of cgroup %s: %w", dir, err)
	}
	return pids, nil
}
