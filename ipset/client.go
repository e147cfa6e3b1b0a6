package ipset

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"syscall"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nl"
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
	conn      *nl.Conn
	req       nl.Batch // the request under way, its memory reused
	proto     uint8    // negotiated protocol; 0 until the first request
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
	var ns int
	if o.NetNS != 0 && o.NetNS != netns.None() {
		ns = int(o.NetNS)
	}
	conn, err := nl.Open(netlinkNetfilter, nl.Options{NetNS: ns})
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

// request sends one message, which fill completes, and calls each with
// the attributes of every message of the kernel's answer (a dump when
// flags has nl.Dump). ctx bounds the request.
func (c *Client) request(ctx context.Context, op, set string, cmd uint8, flags uint16, entries int,
	fill func(b *nl.Batch), each func(attrs []byte) error) error {
	if err := ctx.Err(); err != nil {
		return &OpError{Op: op, Set: set, Err: err}
	}
	read := c.conn.Get
	if flags&nl.Dump == nl.Dump {
		read, flags = c.conn.Dump, flags&^nl.Dump
	}
	c.req.Reset()
	// nfgenmsg: family NFPROTO_UNSPEC, version NFNETLINK_V0, res_id 0.
	c.req.Message(subsysIPSet<<8|uint16(cmd), flags, 0, 0, 0, 0)
	fill(&c.req)
	if c.observe != nil {
		c.observe(cmd, entries)
	}
	err := read(ctx, &c.req, func(_ uint16, data []byte) error {
		if each == nil {
			return nil
		}
		attrs, err := payload(data)
		if err != nil {
			return err
		}
		return each(attrs)
	})
	if err != nil {
		if ctx.Err() != nil {
			return &OpError{Op: op, Set: set, Err: ctx.Err()}
		}
		return kernelError(op, set, err)
	}
	return nil
}

// protocol negotiates the protocol version once: the kernel's newest, up
// to protocolIndex.
func (c *Client) protocol(ctx context.Context) (uint8, error) {
	if c.proto != 0 {
		return c.proto, nil
	}
	var kernel uint8
	err := c.request(ctx, "protocol", "", cmdProtocol, 0, 0, func(b *nl.Batch) {
		b.Uint8(attrProtocol, protocolMin)
	}, func(attrs []byte) error {
		return decode(attrs, func(d *nl.Decoder) {
			if d.Type() == attrProtocol {
				kernel = d.Uint8()
			}
		})
	})
	if err != nil {
		// Without the ip_set module nfnetlink answers EINVAL for its subsystem.
		if errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EINVAL) {
			return 0, fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return 0, err
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
	var rev uint8
	err := c.request(ctx, "type", string(t), cmdType, 0, 0, func(b *nl.Batch) {
		b.Uint8(attrProtocol, c.proto)
		putName(b, attrTypeName, string(t))
		b.Uint8(attrFamily, uint8(f))
	}, func(attrs []byte) error {
		return decode(attrs, func(d *nl.Decoder) {
			if d.Type() == attrRevision {
				rev = d.Uint8()
			}
		})
	})
	if err != nil {
		return 0, err
	}
	c.revisions[k] = rev
	return rev, nil
}

// decode walks the attributes of an ipset reply, whose values are in
// network byte order.
func decode(attrs []byte, f func(d *nl.Decoder)) error {
	d := nl.NewDecoder(attrs)
	d.Order = binary.BigEndian
	for d.Next() {
		f(d)
	}
	return d.Err()
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
	flags := uint16(nl.Create)
	if excl {
		flags |= nl.Excl
	}
	name := c.KernelName(s.Name)
	err = c.request(ctx, "create", name, cmdCreate, flags, 0, func(b *nl.Batch) {
		b.Uint8(attrProtocol, proto)
		putName(b, attrSetName, name)
		putName(b, attrTypeName, string(s.Type))
		b.Uint8(attrRevision, rev)
		b.Uint8(attrFamily, uint8(s.Family))
		b.Nest(attrData | nl.Nested)
		encodeCreate(b, s)
		b.End()
	}, nil)
	if err == nil {
		c.log.Info("ipset created", "set", name, "type", s.Type, "family", s.Family)
	}
	return err
}

func encodeCreate(b *nl.Batch, s Set) {
	if s.Type == BitmapPort {
		putU16(b, attrPort, s.PortFrom)
		putU16(b, attrPortTo, s.PortTo)
	}
	if s.HashSize != 0 {
		putU32(b, attrHashSize, s.HashSize)
	}
	if s.MaxElem != 0 {
		putU32(b, attrMaxElem, s.MaxElem)
	}
	if s.Timeout != 0 {
		putU32(b, attrTimeout, uint32(s.Timeout/time.Second))
	}
	var flags uint32
	if s.Comment {
		flags |= cadtWithComment
	}
	if s.Counters {
		flags |= cadtWithCounters
	}
	if flags != 0 {
		putU32(b, attrCadtFlags, flags)
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
	err = c.request(ctx, op, full, cmd, nl.Excl, 0, func(b *nl.Batch) {
		b.Uint8(attrProtocol, proto)
		putName(b, attrSetName, full)
	}, nil)
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
