package xtables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
)

// errMalformed reports a netlink message or attribute that does not parse.
var errMalformed = errors.New("malformed netlink data")

// attribute is one netlink attribute: its type without flag bits and its
// payload.
type attribute struct {
	typ  uint16
	data []byte
}

// parseAttrs splits b into attributes.
func parseAttrs(b []byte) ([]attribute, error) {
	var out []attribute
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errMalformed
		}
		n := int(binary.LittleEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return nil, errMalformed
		}
		out = append(out, attribute{typ: binary.LittleEndian.Uint16(b[2:]) &^ 0xc000, data: b[4:n]})
		n = (n + 3) &^ 3
		if n > len(b) {
			n = len(b)
		}
		b = b[n:]
	}
	return out, nil
}

func attrU32(a attribute) uint32 {
	if len(a.data) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(a.data)
}

func attrU64(a attribute) uint64 {
	if len(a.data) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(a.data)
}

func attrString(a attribute) string {
	return string(bytes.TrimRight(a.data, "\x00"))
}

// dumpedRule is a rule as the kernel lists it.
type dumpedRule struct {
	table   string
	chain   string
	handle  uint64
	sig     uint64
	jumpsTo string
}

// dumpedChain is a chain as the kernel lists it.
type dumpedChain struct {
	table string
	name  string
	base  bool
	use   uint32
}

// nfPayload returns the attributes of an nf_tables message (after its
// nlmsghdr and nfgenmsg) and its type.
func nfPayload(msg []byte) (uint16, Family, []byte, error) {
	if len(msg) < 20 {
		return 0, 0, nil, errMalformed
	}
	n := int(binary.LittleEndian.Uint32(msg))
	if n < 20 || n > len(msg) {
		return 0, 0, nil, errMalformed
	}
	return binary.LittleEndian.Uint16(msg[4:]) & 0xff, Family(msg[16]), msg[20:n], nil
}

// parseRule decodes an NFT_MSG_NEWRULE message from a dump or an echo.
func parseRule(msg []byte) (dumpedRule, error) {
	_, _, payload, err := nfPayload(msg)
	if err != nil {
		return dumpedRule{}, err
	}
	attrs, err := parseAttrs(payload)
	if err != nil {
		return dumpedRule{}, err
	}
	var r dumpedRule
	var exprs []byte
	foreign := false
	for _, a := range attrs {
		switch a.typ {
		case attrRuleTable:
			r.table = attrString(a)
		case attrRuleChain:
			r.chain = attrString(a)
		case attrRuleHandle:
			r.handle = attrU64(a)
		case attrRuleExprs:
			exprs = a.data
		case 7: // NFTA_RULE_USERDATA: iptables-nft writes none.
			foreign = true
		}
	}
	r.sig, r.jumpsTo, err = exprSig(exprs)
	if foreign {
		r.sig ^= 0x9e3779b97f4a7c15
	}
	return r, err
}

// parseChain decodes an NFT_MSG_NEWCHAIN message from a dump.
func parseChain(msg []byte) (dumpedChain, error) {
	_, _, payload, err := nfPayload(msg)
	if err != nil {
		return dumpedChain{}, err
	}
	attrs, err := parseAttrs(payload)
	if err != nil {
		return dumpedChain{}, err
	}
	var c dumpedChain
	for _, a := range attrs {
		switch a.typ {
		case attrChainTable:
			c.table = attrString(a)
		case attrChainName:
			c.name = attrString(a)
		case attrChainHook:
			c.base = true
		case attrChainUse:
			c.use = attrU32(a)
		}
	}
	return c, nil
}

// parseTableUse decodes the name and use count of an NFT_MSG_NEWTABLE
// message.
func parseTableUse(msg []byte) (string, uint32, error) {
	_, _, payload, err := nfPayload(msg)
	if err != nil {
		return "", 0, err
	}
	attrs, err := parseAttrs(payload)
	if err != nil {
		return "", 0, err
	}
	var name string
	var use uint32
	for _, a := range attrs {
		switch a.typ {
		case attrTableName:
			name = attrString(a)
		case attrTableUse:
			use = attrU32(a)
		}
	}
	return name, use, nil
}

// Signature returns a hash of the rule's expressions that is equal for the
// rule as encoded here and as the kernel dumps it back: counter values are
// left out, and xt info blobs are compared without trailing zeros (the
// kernel dumps some of them shorter).
func Signature(f Family, r *Rule) (uint64, error) {
	b, err := EncodeExprs(f, r)
	if err != nil {
		return 0, err
	}
	sig, _, err := exprSig(b)
	return sig, err
}

// exprSig returns the canonical hash of an NFTA_RULE_EXPRESSIONS payload,
// and the chain its verdict jumps or goes to, if any.
func exprSig(b []byte) (uint64, string, error) {
	elems, err := parseAttrs(b)
	if err != nil {
		return 0, "", err
	}
	h := fnv.New64a()
	var canon []byte
	var jump string
	for _, el := range elems {
		attrs, err := parseAttrs(el.data)
		if err != nil {
			return 0, "", err
		}
		var name string
		var data []byte
		for _, a := range attrs {
			switch a.typ {
			case attrExprName:
				name = attrString(a)
			case attrExprData:
				data = a.data
			}
		}
		canon, jump, err = appendCanonExpr(canon[:0], name, data, jump)
		if err != nil {
			return 0, "", fmt.Errorf("expression %s: %w", name, err)
		}
		h.Write(canon)
	}
	return h.Sum64(), jump, nil
}

// appendCanonExpr appends a canonical form of one expression: its name,
// then its attributes sorted by type, nested ones canonical too.
func appendCanonExpr(b []byte, name string, data []byte, jump string) ([]byte, string, error) {
	b = append(b, name...)
	b = append(b, 0)
	if name == "counter" {
		return b, jump, nil
	}
	attrs, err := parseAttrs(data)
	if err != nil {
		return nil, "", err
	}
	slices.SortStableFunc(attrs, func(x, y attribute) int { return int(x.typ) - int(y.typ) })
	for _, a := range attrs {
		v := a.data
		switch {
		case (name == "match" || name == "target") && a.typ == attrXtInfo:
			v = bytes.TrimRight(v, "\x00")
		case name == "bitwise" && a.typ == 6 && attrU32(a) == 0:
			continue // NFTA_BITWISE_OP: the kernel reports the default
		case name == "immediate" && a.typ == attrImmData,
			name == "cmp" && a.typ == attrCmpData,
			name == "bitwise" && (a.typ == attrBitwiseMask || a.typ == attrBitwiseXor):
			var chain string
			v, chain, err = canonData(a.data)
			if err != nil {
				return nil, "", err
			}
			if chain != "" {
				jump = chain
			}
		}
		b = binary.LittleEndian.AppendUint16(b, a.typ)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b, jump, nil
}

// canonData canonicalises an NFTA_DATA nest (a value or a verdict) and
// returns the chain of a jump or goto verdict.
func canonData(b []byte) ([]byte, string, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return nil, "", err
	}
	var out []byte
	var chain string
	for _, a := range attrs {
		v := a.data
		if a.typ == attrDataVerdict {
			va, err := parseAttrs(a.data)
			if err != nil {
				return nil, "", err
			}
			v = nil
			for _, x := range va {
				if x.typ == attrVerdictChan {
					chain = attrString(x)
				}
				v = binary.LittleEndian.AppendUint16(v, x.typ)
				v = append(v, bytes.TrimRight(x.data, "\x00")...)
			}
		}
		out = binary.LittleEndian.AppendUint16(out, a.typ)
		out = append(out, v...)
	}
	return out, chain, nil
}
