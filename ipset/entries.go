package ipset

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// batchBytes bounds the encoded entries of one add or delete message; a
// longer list goes in several messages.
const batchBytes = 32 << 10

// Add adds entries to a set. An entry already present is updated: its
// timeout restarts and its comment is replaced. Every entry is checked
// against the set's type first; if any does not fit, nothing is sent.
func (c *Client) Add(ctx context.Context, name string, entries ...Entry) error {
	info, err := c.Get(ctx, name)
	if err != nil {
		return err
	}
	valid, err := validateAll(&info.Set, entries)
	if err != nil {
		return err
	}
	return c.batch(ctx, "add", cmdAdd, info, valid)
}

// Delete removes entries from a set; entries not in the set are ignored.
// As with Add, nothing is sent if any entry does not fit the set.
func (c *Client) Delete(ctx context.Context, name string, entries ...Entry) error {
	info, err := c.Get(ctx, name)
	if err != nil {
		return err
	}
	valid, err := validateAll(&info.Set, entries)
	if err != nil {
		return err
	}
	return c.batch(ctx, "del", cmdDel, info, valid)
}

// Test reports whether a set holds an entry, as the kernel matches it: in
// a hash:net or hash:ip,port,net set a host (a full-length prefix) matches
// any network that contains it, a shorter prefix only itself.
func (c *Client) Test(ctx context.Context, name string, e Entry) (bool, error) {
	info, err := c.Get(ctx, name)
	if err != nil {
		return false, err
	}
	if e, err = validateEntry(&info.Set, e); err != nil {
		return false, err
	}
	proto, err := c.lockedProto(ctx)
	defer c.mu.Unlock()
	if err != nil {
		return false, err
	}
	full := c.KernelName(name)
	err = c.request(ctx, "test", full, cmdTest, 0, 1, func(b *nl.Batch) {
		b.Uint8(attrProtocol, proto)
		putName(b, attrSetName, full)
		b.Attr(attrData|nl.Nested, appendEntry(nil, info.Type, e))
	}, nil)
	if errors.Is(err, syscall.Errno(errExist)) {
		return false, nil
	}
	return err == nil, err
}

func validateAll(s *Set, entries []Entry) ([]Entry, error) {
	out := make([]Entry, len(entries))
	var errs []error
	for i, e := range entries {
		v, err := validateEntry(s, e)
		if err != nil {
			errs = append(errs, err)
		}
		out[i] = v
	}
	return out, errors.Join(errs...)
}

// batch sends entries in as few messages as batchBytes allows: each
// message carries a list of entries (IPSET_ATTR_ADT), which the kernel
// applies in order.
func (c *Client) batch(ctx context.Context, op string, cmd uint8, info *SetInfo, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	proto, err := c.lockedProto(ctx)
	defer c.mu.Unlock()
	if err != nil {
		return err
	}
	full := c.KernelName(info.Name)
	var adt []byte // the entries of one message, reused
	for start := 0; start < len(entries); {
		end := start + batchLen(entries[start:])
		chunk := entries[start:end]
		adt = appendADT(adt[:0], info.Type, chunk)
		err := c.request(ctx, op, full, cmd, 0, len(chunk), func(b *nl.Batch) {
			b.Uint8(attrProtocol, proto)
			putName(b, attrSetName, full)
			putU32(b, attrLineNo, 0)
			b.Attr(attrADT|nl.Nested, adt)
		}, nil)
		if err != nil {
			return fmt.Errorf("entries %d-%d of %d: %w", start+1, end, len(entries), err)
		}
		start = end
	}
	c.log.Debug("ipset "+op, "set", full, "entries", len(entries))
	return nil
}

// batchLen is how many of entries fit in one message.
func batchLen(entries []Entry) int {
	size := 0
	for i, e := range entries {
		size += entrySize(e)
		if size > batchBytes && i > 0 {
			return i
		}
	}
	return len(entries)
}

// entrySize bounds the encoded size of an entry: the nest header, two
// nested IPv6 addresses, port, protocol and prefix lengths, the timeout
// and the comment.
func entrySize(e Entry) int {
	return 4 + 2*(4+4+16) + 3*8 + 8 + 4 + len(e.Comment) + 4
}

// appendADT appends the entries of one add or delete message, each in
// its DATA nest: the payload of the ADT attribute.
func appendADT(b []byte, t Type, entries []Entry) []byte {
	for _, e := range entries {
		var at int
		b, at = nl.AppendNest(b, attrData)
		b = appendEntry(b, t, e)
		nl.EndNest(b, at)
	}
	return b
}

// appendEntry appends an entry's attributes for a set of type t.
func appendEntry(b []byte, t Type, e Entry) []byte {
	f := typeFields[t]
	switch {
	case t == HashNet:
		b = appendAddr(b, attrIP, e.Net.Addr())
		b = appendU8(b, attrCIDR, uint8(e.Net.Bits()))
	case f.ip:
		b = appendAddr(b, attrIP, e.IP)
	}
	if f.port {
		b = appendU16(b, attrPort, e.Port)
		if t != BitmapPort {
			b = appendU8(b, attrProto, uint8(e.Protocol))
		}
	}
	if f.ip2 {
		b = appendAddr(b, attrIP2, e.IP2)
	}
	if t == HashIPPortNet {
		b = appendAddr(b, attrIP2, e.Net.Addr())
		b = appendU8(b, attrCIDR2, uint8(e.Net.Bits()))
	}
	if e.Timeout != 0 {
		b = appendU32(b, attrTimeout, uint32(e.Timeout/time.Second))
	}
	if e.Comment != "" {
		b = appendString(b, attrComment, e.Comment)
	}
	return b
}
