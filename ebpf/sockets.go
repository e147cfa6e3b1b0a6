//go:build linux

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockdiag"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// staleSockets ends the connected UDP sockets whose flows are stale: a
// socket the hooks sent to an endpoint that no longer serves its frontend
// while others do (servicelb.StaleFlow). kube-proxy deletes such a flow's
// conntrack entry, so that the client's next datagram is translated
// afresh; a socket the hooks connected to the endpoint itself has no entry
// to delete, and keeps sending to the endpoint until it is ended. So it
// is ended as `ss -K` ends a socket (internal/sockdiag): its owner's next
// receive fails with ECONNABORTED, the socket loses its peer, and a
// client that connects again is balanced again. Unconnected sockets need
// none of this: each send meets the hooks (kp_udpflows).
//
// The sockets are found from the hooks' reverse translations (kp_revnat:
// socket cookie and endpoint to the frontend): only when one names a
// stale endpoint are the processes of the cgroup searched for the socket
// (see endSockets).
type staleSockets Proxier

// DeleteStale implements conntrack.FlowCleaner for the syncer's Engine,
// which calls it after a sync with the stale-flow filters the sync left.
// It runs under the Proxier's lock.
func (s *staleSockets) DeleteStale(ctx context.Context, filters []servicelb.StaleFlow) (int, error) {
	p := (*Proxier)(s)
	if p.maps == nil || p.noSocketEnd {
		return 0, nil
	}
	stale, err := p.staleTranslations(filters)
	if err != nil || len(stale) == 0 {
		return 0, err
	}
	n, err := p.endSockets(ctx, stale)
	if errors.Is(err, sockdiag.ErrUnsupported) {
		p.noSocketEnd = true
		p.log.Warn("connected UDP sockets stay with endpoints that stopped serving: the kernel cannot end them",
			"err", err)
		return n, nil
	}
	if n > 0 {
		p.log.Info("ended connected UDP sockets whose endpoint stopped serving", "sockets", n)
	}
	return n, err
}

// staleTranslations returns the reverse translations (socket and
// endpoint) whose frontend is a UDP frontend of filters and whose
// endpoint does not serve it.
func (p *Proxier) staleTranslations(filters []servicelb.StaleFlow) (map[revKey]bool, error) {
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
	stale := map[revKey]bool{}
	for k, fe := range rev {
		if f := byFrontend[fe]; f != nil && !f.Keeps(k.endpoint.AddrPort()) {
			stale[k] = true
		}
	}
	return stale, nil
}

// endSockets ends the connected UDP sockets whose cookie and endpoint
// are a key of stale, and returns how many it ended. The network
// namespaces they may be in are those of the sockets of the cgroup's
// processes whose cookies stale names (SIOCGSKNS on each socket, taken
// with pidfd_getfd: a socket's namespace need not be its process's); each
// is then listed as the kernel holds it (getpeername, which the hooks
// rewrite, would show the service instead of the endpoint). A process or
// socket that goes meanwhile is passed over.
func (p *Proxier) endSockets(ctx context.Context, stale map[revKey]bool) (int, error) {
	cookies := map[uint64]bool{}
	for k := range stale {
		cookies[k.Cookie] = true
	}
	pids, err := cgroupProcs(p.opts.Cgroup)
	if err != nil {
		return 0, err
	}
	nss := namespaces{}
	defer nss.close()
	var blind error
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if pid == 0 {
			blind = errors.New("the cgroup holds processes of another PID namespace: run in the host's")
			continue
		}
		if err := nss.addSocketsOf(pid, cookies); err != nil {
			blind = err
		}
	}
	if blind != nil && !p.blindWarned {
		p.blindWarned = true
		p.log.Warn("some connected UDP sockets may stay with endpoints that stopped serving: "+
			"kproxy cannot look at every process's sockets", "err", blind)
	}
	ended := 0
	var errs []error
	for _, ns := range nss {
		n, err := endStaleIn(ctx, ns, stale)
		ended += n
		switch {
		case errors.Is(err, sockdiag.ErrUnsupported):
			return ended, err
		case err != nil:
			errs = append(errs, err)
		}
	}
	return ended, errors.Join(errs...)
}

// endStaleIn ends the connected UDP sockets of the network namespace ns
// whose cookie and endpoint are a key of stale, with one socket
// diagnostics socket, and returns how many it ended.
func endStaleIn(ctx context.Context, ns int, stale map[revKey]bool) (int, error) {
	c, err := sockdiag.Open(ns)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	socks, err := c.List(ctx, unix.IPPROTO_UDP, 1<<sockdiag.Established)
	if err != nil {
		return 0, err
	}
	ended := 0
	var errs []error
	for _, s := range socks {
		if !stale[revKey{Cookie: s.Cookie, endpoint: newEndpoint(s.Peer.Addr(), s.Peer.Port())}] {
			continue
		}
		switch err := c.Destroy(ctx, s); {
		case err == nil:
			ended++
		case errors.Is(err, unix.ENOENT): // closed or connected elsewhere meanwhile
		case errors.Is(err, sockdiag.ErrUnsupported):
			return ended, err
		default:
			errs = append(errs, err)
		}
	}
	return ended, errors.Join(errs...)
}

// namespaces are open network namespaces by inode.
type namespaces map[uint64]int

func (nss namespaces) close() {
	for _, fd := range nss {
		unix.Close(fd)
	}
}

// addSocketsOf adds the network namespaces of the sockets of process pid
// whose cookies are in cookies. It fails only when it may not look at
// the process's descriptors (CAP_SYS_PTRACE); a process or descriptor
// gone meanwhile is passed over.
func (nss namespaces) addSocketsOf(pid int, cookies map[uint64]bool) error {
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
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			if err := nss.addSocket(pidfd, fd, cookies); err != nil {
				return denied(pid, err)
			}
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

// addSocket adds the network namespace of descriptor fd of the process
// of pidfd when it is a socket whose cookie is in cookies.
func (nss namespaces) addSocket(pidfd, fd int, cookies map[uint64]bool) error {
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return err // denied, or closed meanwhile
	}
	defer unix.Close(dup)
	if cookie, err := unix.GetsockoptUint64(dup, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil || !cookies[cookie] {
		return nil
	}
	ns, err := unix.IoctlRetInt(dup, unix.SIOCGSKNS)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(ns, &st); err != nil || nss[st.Ino] != 0 {
		unix.Close(ns)
		return nil
	}
	nss[st.Ino] = ns
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
