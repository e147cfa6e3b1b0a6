package ipset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"syscall"
)

// Options configure a Client.
type Options struct {
	// NetNS is the network namespace whose sets the client manages. The
	// zero value and netns.None() mean the namespace of the thread that
	// calls New.
	NetNS netns.NsHandle
	// Prefix starts the kernel name of every set the client manages
	// (required). Set names given to the client exclude it; the client
	// lists and destroys only sets whose names carry it, so clients with
	// different prefixes share a namespace without touching each other's
	// sets. The prefix and name together fit in 31 bytes.
	Prefix string
	// Logger receives state changes at Info and per-call detail at
	// Debug; nil discards.
	Logger *slog.Logger
}

// Client manages the ipset sets of one namespace that carry its prefix.
// It holds one netlink socket; its methods may be called concurrently
// (they are serialised).
type Client struct {
	prefix string
	log    *slog.Logger

	mu        sync.Mutex
	conn      *netlink.Conn
	proto     uint8 // negotiated protocol; 0 until the first request
	revisions map[typeKey]uint8
	observe   func(cmd uint8, entries int) // test hook: every request sent
}

type typeKey struct {
	t Type
	f Family
}

// New opens a client. It opens a netlink socket in the target namespace
// (which needs CAP_SYS_ADMIN when the namespace is not the caller's) and
// sends nothing yet; each method needs CAP_NET_ADMIN in that namespace.
func New(o Options) (*Client, error) {
	if o.Prefix == "" {
		return nil, &SetError{Reason: "Options.Prefix is required"}
	}
	if err := validateName(o.Prefix, "x"); err != nil {
		return nil, &SetError{Set: o.Prefix, Reason: "prefix: " + err.(*SetError).Reason}
	}
	cfg := &netlink.Config{}
	if o.NetNS != 0 && o.NetNS != netns.None() {
		cfg.NetNS = int(o.NetNS)
	}
	conn, err := netlink.Dial(netlinkNetfilter, cfg)
	if err != nil {
		return nil, &OpError{Op: "open", Err: err}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{prefix: o.Prefix, log: log, conn: conn, revisions: make(map[typeKey]uint8)}, nil
}

// Close closes the netlink socket. The sets stay in the kernel.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.Close()
}

// Prefix returns the client's set name prefix.
func (c *Client) Prefix() string { return c.prefix }

// KernelName is the name the kernel (and `ipset list`, and iptables'
// `--match-set`) knows the set by: the prefix followed by name.
func (c *Client) KernelName(name string) string { return c.prefix + name }

// request sends one message and returns the replies. ctx cancels a
// request in flight through the socket deadline.
func (c *Client) request(ctx context.Context, op, set string, cmd uint8, flags netlink.HeaderFlags, entries int,
	fill func(ae *netlink.AttributeEncoder)) ([]netlink.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, &OpError{Op: op, Set: set, Err: err}
	}
	msg, err := message(cmd, flags, fill)
	if err != nil {
		return nil, &OpError{Op: op, Set: set, Err: err}
	}
	deadline, _ := ctx.Deadline()
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, &OpError{Op: op, Set: set, Err: err}
	}
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if c.observe != nil {
		c.observe(cmd, entries)
	}
	replies, err := c.conn.Execute(msg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &OpError{Op: op, Set: set, Err: ctx.Err()}
		}
		return nil, kernelError(op, set, err)
	}
	return replies, nil
}

// protocol negotiates the protocol version once: the kernel's newest, up
// to protocolIndex.
func (c *Client) protocol(ctx context.Context) (uint8, error) {
	if c.proto != 0 {
		return c.proto, nil
	}
	replies, err := c.request(ctx, "protocol", "", cmdProtocol, 0, 0, func(ae *netlink.AttributeEncoder) {
		ae.Uint8(attrProtocol, protocolMin)
	})
	if err != nil {
		// Without the ip_set module nfnetlink answers EINVAL for its subsystem.
		if isNetlinkErr(err, syscall.EPROTONOSUPPORT) || isNetlinkErr(err, syscall.ENOENT) || isNetlinkErr(err, syscall.EINVAL) {
			return 0, fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return 0, err
	}
	var kernel uint8
	for _, r := range replies {
		if err := decode(r, func(ad *netlink.AttributeDecoder) {
			if ad.Type() == attrProtocol {
				kernel = ad.Uint8()
			}
		}); err != nil {
			return 0, &OpError{Op: "protocol", Err: err}
		}
	}
	if kernel < protocolMin {
		return 0, &OpError{Op: "protocol", Err: fmt.Errorf("%w: kernel speaks ipset protocol %d", ErrNotSupported, kernel)}
	}
	c.proto = min(kernel, protocolIndex)
	c.log.Debug("ipset protocol", "kernel", kernel, "used", c.proto)
	return c.proto, nil
}

// revision asks the kernel for the newest revision of a set type (as the
// ipset tool does), once per type and family.
func (c *Client) revision(ctx context.Context, t Type, f Family) (uint8, error) {
	k := typeKey{t, f}
	if r, ok := c.revisions[k]; ok {
		return r, nil
	}
	replies, err := c.request(ctx, "type", string(t), cmdType, 0, 0, func(ae *netlink.AttributeEncoder) {
		ae.Uint8(attrProtocol, c.proto)
		putName(ae, attrTypeName, string(t))
		ae.Uint8(attrFamily, uint8(f))
	})
	if err != nil {
		return 0, err
	}
	var rev uint8
	for _, r := range replies {
		if err := decode(r, func(ad *netlink.AttributeDecoder) {
			if ad.Type() == attrRevision {
				rev = ad.Uint8()
			}
		}); err != nil {
			return 0, &OpError{Op: "type", Set: string(t), Err: err}
		}
	}
	c.revisions[k] = rev
	return rev, nil
}

// decode walks the attributes of an ipset reply.
func decode(m netlink.Message, f func(ad *netlink.AttributeDecoder)) error {
	b, err := payload(m)
	if err != nil {
		return err
	}
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return err
	}
	ad.ByteOrder = bigEndian
	for ad.Next() {
		f(ad)
	}
	return ad.Err()
}

// lockedProto takes the client lock and negotiates the protocol; callers
// defer c.mu.Unlock().
func (c *Client) lockedProto(ctx context.Context) (uint8, error) {
	c.mu.Lock()
	return c.protocol(ctx)
}

// Probe asks the kernel which ipset protocol it speaks, changing nothing:
// nil when it has ipset and answers the client, an error wrapping
// ErrNotSupported when it has no ipset (or one too old), else the
// kernel's refusal (EPERM without CAP_NET_ADMIN in the namespace).
func (c *Client) Probe(ctx context.Context) error {
	defer c.mu.Unlock()
	_, err := c.lockedProto(ctx)
	return err
}

// Create creates a set. It fails with ErrExist if a set of that name
// exists, whatever its settings.
func (c *Client) Create(ctx context.Context, s Set) error {
	return c.create(ctx, s, true)
}

// Ensure creates a set unless an identical one (type, family, timeout,
// comment, counters, maxelem) exists, which it adopts as it is; a set of
// that name with other settings fails with ErrIncompatible and is left
// alone.
func (c *Client) Ensure(ctx context.Context, s Set) error {
	err := c.create(ctx, s, false)
	if errors.Is(err, ErrExist) {
		return &OpError{Op: "create", Set: c.KernelName(s.Name), Err: fmt.Errorf("%w: %w", ErrIncompatible, err)}
	}
	return err
}

func (c *Client) create(ctx context.Context, s Set, excl bool) error {
	if err := validateSet(c.prefix, s); err != nil {
		return err
	}
	proto, err := c.lockedProto(ctx)
	defer c.mu.Unlock()
	if err != nil {
		return err
	}
	rev, err := c.revision(ctx, s.Type, s.Family)
	if err != nil {
		return err
	}
	flags := netlink.Acknowledge | netlink.Create
	if excl {
		flags |= netlink.Excl
	}
	name := c.KernelName(s.Name)
	_, err = c.request(ctx, "create", name, cmdCreate, flags, 0, func(ae *netlink.AttributeEncoder) {
		ae.Uint8(attrProtocol, proto)
		putName(ae, attrSetName, name)
		putName(ae, attrTypeName, string(s.Type))
		ae.Uint8(attrRevision, rev)
		ae.Uint8(attrFamily, uint8(s.Family))
		ae.Nested(attrData, func(nae *netlink.AttributeEncoder) error {
			encodeCreate(nae, s)
			return nil
		})
	})
	if err == nil {
		c.log.Info("ipset created", "set", name, "type", s.Type, "family", s.Family)
	}
	return err
}

func encodeCreate(ae *netlink.AttributeEncoder, s Set) {
	if s.Type == BitmapPort {
		putU16(ae, attrPort, s.PortFrom)
		putU16(ae, attrPortTo, s.PortTo)
	}
	if s.HashSize != 0 {
		putU32(ae, attrHashSize, s.HashSize)
	}
	if s.MaxElem != 0 {
		putU32(ae, attrMaxElem, s.MaxElem)
	}
	if s.Timeout != 0 {
		putU32(ae, attrTimeout, uint32(s.Timeout/time.Second))
	}
	var flags uint32
	if s.Comment {
		flags |= cadtWithComment
	}
	if s.Counters {
		flags |= cadtWithCounters
	}
	if flags != 0 {
		putU32(ae, attrCadtFlags, flags)
	}
}

// Destroy destroys a set of the client (ErrNotExist if there is none,
// ErrInUse while a rule references it).
func (c *Client) Destroy(ctx context.Context, name string) error {
	return c.simple(ctx, "destroy", cmdDestroy, name)
}

// Flush removes every entry of a set.
func (c *Client) Flush(ctx context.Context, name string) error {
	return c.simple(ctx, "flush", cmdFlush, name)
}

func (c *Client) simple(ctx context.Context, op string, cmd uint8, name string) error {
	if err := validateName(c.prefix, name); err != nil {
		return err
	}
	proto, err := c.lockedProto(ctx)
	defer c.mu.Unlock()
	if err != nil {
		return err
	}
	full := c.KernelName(name)
	// Without NLM_F_EXCL, newer kernels destroy a missing set silently.
	_, err = c.request(ctx, op, full, cmd, netlink.Acknowledge|netlink.Excl, 0, func(ae *netlink.AttributeEncoder) {
		ae.Uint8(attrProtocol, proto)
		putName(ae, attrSetName, full)
	})
	if err == nil {
		c.log.Info("ipset "+op, "set", full)
	}
	return err
}

// Cleanup destroys every set that carries the client's prefix, and only
// those. It tries them all and joins the errors (a set still referenced by
// a rule fails with ErrInUse).
func (c *Client) Cleanup(ctx context.Context) error {
	sets, err := c.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range sets {
		if err := c.Destroy(ctx, s.Name); err != nil && !errors.Is(err, ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Client) owns(kernelName string) (string, bool) {
	name, ok := strings.CutPrefix(kernelName, c.prefix)
	return name, ok && name != ""
}
