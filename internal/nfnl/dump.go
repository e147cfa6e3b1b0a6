//go:build linux

package nfnl

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// request sends one GET request (a dump when dump is set) built by attrs,
// and calls each for every reply message until the answer is complete. A
// missing object (ENOENT) is reported as ErrNotExist.
func (c *Conn) request(ctx context.Context, typ uint16, fam Family, dump bool, attrs func(*encoder), each func([]byte) error) error {
	return c.requestOf(ctx, subsysNFTables, typ, fam, dump, attrs, each)
}

// requestOf is request to a subsystem of nfnetlink.
func (c *Conn) requestOf(ctx context.Context, subsys, typ uint16, fam Family, dump bool, attrs func(*encoder), each func([]byte) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	seq := c.s.NextSeq(1)
	flags := uint16(nl.Request | nl.Ack)
	if dump {
		flags = nl.Request | nl.Dump
	}
	c.scratch.b = c.scratch.b[:0]
	m := c.scratch.message(subsys<<8|typ, flags, fam, 0)
	attrs(&c.scratch)
	c.scratch.endMessage(m)
	nl.PutSeq(c.scratch.b[m:], seq)
	if c.scratch.err != nil {
		err := c.scratch.err
		c.scratch.err = nil
		return err
	}
	traceRequest(ctx, RequestRead)
	if err := c.s.Write(ctx, c.scratch.b); err != nil {
		return err
	}
	err := c.s.Answer(ctx, seq, func(m nl.Message) error { return each(m.Data) })
	var e *nl.Error
	if errors.As(err, &e) {
		return replyError(e.Errno, e.Text)
	}
	return err
}

func replyError(errno syscall.Errno, text string) error {
	err := error(errno)
	if errno == syscall.ENOENT {
		err = fmt.Errorf("%w: %w", ErrNotExist, errno)
	}
	if text != "" {
		return fmt.Errorf("%w (%s)", err, text)
	}
	return err
}

func tableAttrs(name string) func(*encoder) {
	return func(e *encoder) {
		if name != "" {
			e.str(attrTableName, name)
		}
	}
}

// Table returns one table; ErrNotExist if there is none of that name.
func (c *Conn) Table(ctx context.Context, fam Family, name string) (Table, error) {
	var out Table
	err := c.request(ctx, msgGetTable, fam, false, tableAttrs(name), func(d []byte) error {
		t, err := parseTable(d)
		out = t
		return err
	})
	if err != nil {
		return Table{}, fmt.Errorf("nfnl: get table %s %s: %w", fam, name, err)
	}
	return out, nil
}

// Tables returns every table of a family (all families for 0).
func (c *Conn) Tables(ctx context.Context, fam Family) ([]Table, error) {
	var out []Table
	err := c.request(ctx, msgGetTable, fam, true, tableAttrs(""), func(d []byte) error {
		t, err := parseTable(d)
		out = append(out, t)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nfnl: list tables: %w", err)
	}
	return out, nil
}

// Chains returns the chains of a table, in the kernel's order. When the
// kernel marks the dump as interrupted by a commit (ErrDumpInterrupted),
// the chains it listed are returned with the error, for a caller that can
// tell whether the commit touched the table.
func (c *Conn) Chains(ctx context.Context, fam Family, table string) ([]Chain, error) {
	var out []Chain
	err := c.request(ctx, msgGetChain, fam, true, func(e *encoder) { e.str(attrChainTable, table) }, func(d []byte) error {
		ch, err := parseChain(d)
		if ch.Table == table {
			out = append(out, ch)
		}
		return err
	})
	switch {
	case errors.Is(err, ErrDumpInterrupted) && !errors.Is(err, ErrNotExist) && out != nil:
		return out, fmt.Errorf("nfnl: list chains of %s %s: %w", fam, table, err)
	case err != nil:
		return nil, fmt.Errorf("nfnl: list chains of %s %s: %w", fam, table, err)
	}
	return out, nil
}

// Rules returns the rules of one chain of a table, or of every chain when
// chain is empty, in order.
func (c *Conn) Rules(ctx context.Context, fam Family, table, chain string) ([]Rule, error) {
	return c.rules(ctx, fam, table, chain, true)
}

// RulesRaw is Rules without decoding the expressions: each rule has Raw
// and no Exprs, which is much cheaper for large tables.
func (c *Conn) RulesRaw(ctx context.Context, fam Family, table, chain string) ([]Rule, error) {
	return c.rules(ctx, fam, table, chain, false)
}

func (c *Conn) rules(ctx context.Context, fam Family, table, chain string, decode bool) ([]Rule, error) {
	var out []Rule
	attrs := func(e *encoder) {
		e.str(attrRuleTable, table)
		if chain != "" {
			e.str(attrRuleChain, chain)
		}
	}
	err := c.request(ctx, msgGetRule, fam, true, attrs, func(d []byte) error {
		r, err := parseRawRule(d)
		if err == nil && decode {
			r.Exprs, _ = DecodeExprs(r.Family, r.Raw)
		}
		if r.Table == table && (chain == "" || r.Chain == chain) {
			out = append(out, r)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nfnl: list rules of %s %s %s: %w", fam, table, chain, err)
	}
	return out, nil
}

// EachRule calls each for every rule of a table, or of one chain when chain
// is not empty, in order, as the dump delivers it. It copies nothing: the
// rule, its Raw expressions and their data are valid only during the call.
// It saves RulesRaw's copies when a caller looks at each rule once, as when
// comparing a large table with what it should hold.
func (c *Conn) EachRule(ctx context.Context, fam Family, table, chain string, each func(r *Rule) error) error {
	attrs := func(e *encoder) {
		e.str(attrRuleTable, table)
		if chain != "" {
			e.str(attrRuleChain, chain)
		}
	}
	var r Rule
	err := c.request(ctx, msgGetRule, fam, true, attrs, func(d []byte) error {
		if err := parseRuleInto(&r, d, false); err != nil {
			return err
		}
		if r.Table != table || (chain != "" && r.Chain != chain) {
			return nil
		}
		return each(&r)
	})
	if err != nil {
		return fmt.Errorf("nfnl: list rules of %s %s %s: %w", fam, table, chain, err)
	}
	return nil
}

// Sets returns the named sets and maps of a table (anonymous sets too).
func (c *Conn) Sets(ctx context.Context, fam Family, table string) ([]Set, error) {
	var out []Set
	err := c.request(ctx, msgGetSet, fam, true, func(e *encoder) { e.str(attrSetTable, table) }, func(d []byte) error {
		s, err := parseSet(d)
		if s.Table == table {
			out = append(out, s)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nfnl: list sets of %s %s: %w", fam, table, err)
	}
	return out, nil
}

// Elements returns the elements of a set.
func (c *Conn) Elements(ctx context.Context, fam Family, table, set string) ([]Element, error) {
	var out []Element
	attrs := func(e *encoder) {
		e.str(attrElemListTable, table)
		e.str(attrElemListSet, set)
	}
	err := c.request(ctx, msgGetSetElem, fam, true, attrs, func(d []byte) error {
		els, err := parseElements(d)
		out = append(out, els...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nfnl: list elements of %s %s %s: %w", fam, table, set, err)
	}
	return out, nil
}

func payload(d []byte) (Family, []attribute, error) {
	if len(d) < nfgenLen {
		return 0, nil, nl.ErrMalformed
	}
	as, err := attributes(d[nfgenLen:])
	return Family(d[0]), as, err
}

func parseTable(d []byte) (Table, error) {
	fam, as, err := payload(d)
	t := Table{Family: fam}
	for _, a := range as {
		switch a.typ {
		case attrTableName:
			t.Name = a.str()
		case attrTableFlags:
			t.Flags = a.u32()
		case attrTableUse:
			t.Use = a.u32()
		case attrTableHandle:
			t.Handle = a.u64()
		case attrTableUData:
			t.UserData = clone(a.data)
		}
	}
	return t, err
}

func parseChain(d []byte) (Chain, error) {
	fam, as, err := payload(d)
	c := Chain{Family: fam}
	var hook Hook
	var hooked bool
	for _, a := range as {
		switch a.typ {
		case attrChainTable:
			c.Table = a.str()
		case attrChainName:
			c.Name = a.str()
		case attrChainHandle:
			c.Handle = a.u64()
		case attrChainUse:
			c.Use = a.u32()
		case attrChainUData:
			c.UserData = clone(a.data)
		case attrChainType:
			hook.Type = a.str()
		case attrChainPolicy:
			p := int32(a.u32())
			hook.Policy = &p
		case attrChainHook:
			hooked = true
			parseHook(a.data, &hook)
		}
	}
	if hooked {
		c.Hook = &hook
	}
	return c, err
}

func parseHook(d []byte, h *Hook) {
	as, _ := attributes(d)
	for _, a := range as {
		switch a.typ {
		case attrHookNum:
			h.Num = a.u32()
		case attrHookPriority:
			h.Priority = int32(a.u32())
		case attrHookDev:
			h.Device = a.str()
		}
	}
}

func parseRule(d []byte) (Rule, error) {
	r, err := parseRawRule(d)
	if err == nil {
		r.Exprs, _ = DecodeExprs(r.Family, r.Raw)
	}
	return r, err
}

// parseRawRule parses a rule without decoding its expressions.
func parseRawRule(d []byte) (Rule, error) {
	var r Rule
	err := parseRuleInto(&r, d, true)
	return r, err
}

// parseRuleInto parses a rule into r, reusing r.Raw; without keep, byte
// slices point into d.
func parseRuleInto(r *Rule, d []byte, keep bool) error {
	fam, as, err := payload(d)
	raw := r.Raw[:0]
	*r = Rule{Family: fam}
	for _, a := range as {
		switch a.typ {
		case attrRuleTable:
			r.Table = a.str()
		case attrRuleChain:
			r.Chain = a.str()
		case attrRuleHandle:
			r.Handle = a.u64()
		case attrRulePosition:
			r.Position = a.u64()
		case attrRuleUData:
			r.UserData = a.data
			if keep {
				r.UserData = clone(a.data)
			}
		case attrRuleCompat:
			r.Compat = parseCompat(a.data)
		case attrRuleExprs:
			var perr error
			if raw, perr = appendExprs(raw, a.data, keep); perr != nil {
				return perr
			}
			r.Raw = raw
		}
	}
	return err
}

func parseCompat(d []byte) *Compat {
	as, _ := attributes(d)
	c := &Compat{}
	for _, a := range as {
		switch a.typ {
		case attrCompatProto:
			c.Proto = a.u32()
		case attrCompatFlags:
			c.Flags = a.u32()
		}
	}
	return c
}

// appendExprs appends the expressions of an NFTA_RULE_EXPRESSIONS
// attribute to out; without keep, their data point into d.
func appendExprs(out []RawExpr, d []byte, keep bool) ([]RawExpr, error) {
	list, err := attributes(d)
	if err != nil {
		return nil, err
	}
	for _, l := range list {
		as, err := attributes(l.data)
		if err != nil {
			return nil, err
		}
		var x RawExpr
		for _, a := range as {
			switch a.typ {
			case attrExprName:
				x.Name = a.str()
			case attrExprData:
				x.Data = a.data
				if keep {
					x.Data = clone(a.data)
				}
			}
		}
		out = append(out, x)
	}
	return out, nil
}

func parseSet(d []byte) (Set, error) {
	fam, as, err := payload(d)
	s := Set{Family: fam}
	for _, a := range as {
		switch a.typ {
		case attrSetTable:
			s.Table = a.str()
		case attrSetName:
			s.Name = a.str()
		case attrSetFlags:
			s.Flags = a.u32()
		case attrSetKeyType:
			s.KeyType = a.u32()
		case attrSetKeyLen:
			s.KeyLen = a.u32()
		case attrSetDataType:
			s.DataType = a.u32()
		case attrSetDataLen:
			s.DataLen = a.u32()
		case attrSetID:
			s.ID = a.u32()
		case attrSetHandle:
			s.Handle = a.u64()
		case attrSetTimeout:
			s.Timeout = time.Duration(a.u64()) * time.Millisecond
		case attrSetUData:
			s.UserData = clone(a.data)
		case attrSetDesc:
			parseDesc(a.data, &s)
		}
	}
	return s, err
}

func parseDesc(d []byte, s *Set) {
	as, _ := attributes(d)
	for _, a := range as {
		switch a.typ {
		case attrDescSize:
			s.Size = a.u32()
		case attrDescConcat:
			fields, _ := attributes(a.data)
			for _, f := range fields {
				fs, _ := attributes(f.data)
				for _, x := range fs {
					if x.typ == attrFieldLen {
						s.Fields = append(s.Fields, x.u32())
					}
				}
			}
		}
	}
}

// EachElement calls each for every element of a set, as the dump delivers
// them. It copies nothing: the element and its byte slices are valid only
// during the call. It saves Elements' copies when a caller looks at each
// element once, as when comparing a large set with what it should hold.
func (c *Conn) EachElement(ctx context.Context, fam Family, table, set string, each func(el *Element) error) error {
	attrs := func(e *encoder) {
		e.str(attrElemListTable, table)
		e.str(attrElemListSet, set)
	}
	var el Element
	err := c.request(ctx, msgGetSetElem, fam, true, attrs, func(d []byte) error {
		_, as, err := payload(d)
		if err != nil {
			return err
		}
		for _, a := range as {
			if a.typ != attrElemListElems {
				continue
			}
			list, err := attributes(a.data)
			if err != nil {
				return err
			}
			for _, l := range list {
				if err := parseElementInto(&el, l.data, false); err != nil {
					return err
				}
				if err := each(&el); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("nfnl: list elements of %s %s %s: %w", fam, table, set, err)
	}
	return nil
}

func parseElements(d []byte) ([]Element, error) {
	_, as, err := payload(d)
	if err != nil {
		return nil, err
	}
	var out []Element
	for _, a := range as {
		if a.typ != attrElemListElems {
			continue
		}
		list, err := attributes(a.data)
		if err != nil {
			return nil, err
		}
		for _, l := range list {
			el, err := parseElement(l.data)
			if err != nil {
				return nil, err
			}
			out = append(out, el)
		}
	}
	return out, nil
}

func parseElement(d []byte) (Element, error) {
	var el Element
	err := parseElementInto(&el, d, true)
	return el, err
}

// parseElementInto parses an element into el; without keep, byte slices
// point into d.
func parseElementInto(el *Element, d []byte, keep bool) error {
	as, err := attributes(d)
	*el = Element{}
	cp := func(b []byte) []byte {
		if keep {
			return clone(b)
		}
		return b
	}
	for _, a := range as {
		switch a.typ {
		case attrElemKey:
			el.Key = cp(a.value())
		case attrElemKeyEnd:
			el.KeyEnd = cp(a.value())
		case attrElemData:
			if v := a.verdictOf(); v != nil {
				el.Verdict = v
			} else {
				el.Data = cp(a.value())
			}
		case attrElemFlags:
			el.Flags = a.u32()
		case attrElemTimeout:
			el.Timeout = time.Duration(a.u64()) * time.Millisecond
		case attrElemExpire:
			el.Expires = time.Duration(a.u64()) * time.Millisecond
		case attrElemUData:
			el.UserData = cp(a.data)
		}
	}
	return err
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
