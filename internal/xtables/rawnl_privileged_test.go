//go:build privileged || vm

package xtables

import (
	"encoding/binary"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawBatch sends the messages of m as one nf_tables batch on a fresh
// socket of the calling thread's namespace and returns the first error
// the kernel reports.
func rawBatch(m *msgWriter) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	var b []byte
	b = appendBatchMsg(b, unix.NFNL_MSG_BATCH_BEGIN, 0)
	b = append(b, m.b...)
	b = appendBatchMsg(b, unix.NFNL_MSG_BATCH_END, m.seq+2)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	// The batch is processed while sending; errors are queued already.
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			return nil
		}
		if err != nil {
			return err
		}
		for msg := buf[:n]; len(msg) >= 16; {
			l := int(binary.LittleEndian.Uint32(msg))
			if binary.LittleEndian.Uint16(msg[4:]) == unix.NLMSG_ERROR {
				if code := int32(binary.LittleEndian.Uint32(msg[16:])); code != 0 {
					return fmt.Errorf("batch message seq %d: %w", binary.LittleEndian.Uint32(msg[24:]), syscall.Errno(-code))
				}
			}
			msg = msg[(l+3)&^3:]
		}
	}
}

func appendBatchMsg(b []byte, typ uint16, seq uint32) []byte {
	b = binary.LittleEndian.AppendUint32(b, 20)
	b = binary.LittleEndian.AppendUint16(b, typ)
	b = binary.LittleEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.LittleEndian.AppendUint32(b, seq)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return append(b, 0, 0, 0, subsysNFTables)
}

// rawDump runs an nf_tables dump request and returns its messages.
func rawDump(typ uint16, f Family, attrs func(w *exprWriter)) ([][]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var w exprWriter
	w.b = binary.LittleEndian.AppendUint32(w.b, 0)
	w.b = binary.LittleEndian.AppendUint16(w.b, subsysNFTables<<8|typ)
	w.b = binary.LittleEndian.AppendUint16(w.b, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	w.b = binary.LittleEndian.AppendUint32(w.b, 1)
	w.b = binary.LittleEndian.AppendUint32(w.b, 0)
	w.b = append(w.b, byte(f), 0, 0, 0)
	if attrs != nil {
		attrs(&w)
	}
	binary.LittleEndian.PutUint32(w.b, uint32(len(w.b)))
	if err := unix.Sendto(fd, w.b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out [][]byte
	buf := make([]byte, 1<<20)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		for msg := buf[:n]; len(msg) >= 16; {
			l := int(binary.LittleEndian.Uint32(msg))
			switch binary.LittleEndian.Uint16(msg[4:]) {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if code := int32(binary.LittleEndian.Uint32(msg[16:])); code != 0 {
					return nil, syscall.Errno(-code)
				}
			default:
				out = append(out, append([]byte(nil), msg[:l]...))
			}
			msg = msg[(l+3)&^3:]
		}
	}
}

// rawRuleExprs returns the raw NFTA_RULE_EXPRESSIONS of every rule in a
// chain, in order.
func rawRuleExprs(t Table, chain string) ([][]byte, error) {
	msgs, err := rawDump(msgGetRule, t.Family, func(w *exprWriter) {
		w.str(attrRuleTable, string(t.Name))
		w.str(attrRuleChain, chain)
	})
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, m := range msgs {
		_, _, payload, err := nfPayload(m)
		if err != nil {
			return nil, err
		}
		attrs, err := parseAttrs(payload)
		if err != nil {
			return nil, err
		}
		for _, a := range attrs {
			if a.typ == attrRuleExprs {
				out = append(out, a.data)
			}
		}
	}
	return out, nil
}
