package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/kproxy-dev/kproxy/userspace"
)

// openUserspace opens the userspace backend, which serves each frontend
// from a listener of its own and writes no packet filter rules. By
// default it holds the services' addresses on the namespace's loopback
// (so it needs CAP_NET_ADMIN there, as the other backends do); with
// --userspace-hold-addresses=false it needs no privilege.
func openUserspace(o BackendOptions) (Dataplane, error) {
	uo := userspaceOptions(o)
	if o.UserspaceHandover == "" {
		return userspace.New(uo)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if c, err := dialHandover(o.UserspaceHandover); err == nil {
		uo.TakeOver = c
		log.Info("taking over from the kproxy at the handover socket", "socket", o.UserspaceHandover)
	}
	p, err := userspace.New(uo)
	if err != nil {
		return nil, err
	}
	ln, err := listenHandover(o.UserspaceHandover)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("--userspace-handover-socket: %w", err)
	}
	return &userspaceHandover{Proxier: p, ln: ln, log: log}, nil
}

// userspaceOptions are the userspace backend's options for o.
func userspaceOptions(o BackendOptions) userspace.Options {
	uo := userspace.Options{HoldAddresses: true}
	if o.Userspace != nil {
		uo = *o.Userspace
	}
	uo.NetNS, uo.Logger = o.NetNS, o.Logger
	uo.StrictARP = o.StrictARP && uo.HoldAddresses
	return uo
}

// renderUserspace renders without holding anything or needing privilege.
func renderUserspace(o BackendOptions) (Renderer, error) {
	return userspace.ForRendering(userspaceOptions(o))
}

// handoverServer is a dataplane that hands its sockets to a newer
// process: serveHandover returns nil once it has, and an error when ctx
// ends first.
type handoverServer interface {
	serveHandover(ctx context.Context) error
}

// userspaceHandover is the userspace backend with a handover socket.
type userspaceHandover struct {
	*userspace.Proxier
	ln  *net.UnixListener
	log *slog.Logger
}

// handoverTimeout bounds one handover.
const handoverTimeout = 30 * time.Second

func (u *userspaceHandover) serveHandover(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { u.ln.Close() })
	defer stop()
	for {
		c, err := u.ln.AcceptUnix()
		if err != nil {
			return err
		}
		hctx, cancel := context.WithTimeout(ctx, handoverTimeout)
		h, err := u.HandOver(hctx, c)
		cancel()
		c.Close()
		if err == nil {
			u.log.Info("handed over to a newer kproxy", "listeners", h.Listeners, "connections", h.Conns, "reset", h.Reset)
			return nil
		}
		u.log.Warn("handover failed; serving on", "err", err)
	}
}

func (u *userspaceHandover) Close() error {
	u.ln.Close()
	return u.Proxier.Close()
}

// dialHandover connects to the handover socket of a running kproxy.
func dialHandover(path string) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.Dial("unixpacket", path)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// listenHandover listens at path for the next kproxy: at a path of its
// own first, renamed over path, so that a process dialing path meets an
// older listener or this one, never none; the file is left in place at
// exit (a newer process may own path by then), and a stale one only
// refuses the next dial.
func listenHandover(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	return ln, nil
}

// cleanupUserspace removes the addresses a userspace proxier held (and
// the dummy link it made), whatever the flags of the run: what a proxy
// of another run left is cleaned up all the same.
func cleanupUserspace(ctx context.Context, o BackendOptions) error {
	p, err := userspace.New(userspace.Options{NetNS: o.NetNS, HoldAddresses: true, Logger: o.Logger})
	if err != nil {
		return err
	}
	return errors.Join(p.Cleanup(ctx), p.Close())
}

// unprivileged reports whether the userspace backend runs without
// holding addresses: it needs no privilege, and can clean up no other
// backend's objects.
func unprivileged(o BackendOptions) bool { return o.Userspace != nil && !o.Userspace.HoldAddresses }

// probeUserspace checks what the userspace backend needs, changing
// nothing: the privileges its options take.
func probeUserspace(o BackendOptions) error { return userspace.Probe(userspaceOptions(o)) }
