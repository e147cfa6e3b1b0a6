//go:build linux

package userspace

import (
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SCTP constants of linux/sctp.h that golang.org/x/sys/unix lacks.
const (
	sctpNoDelay      = 3      // SCTP_NODELAY
	sctpRecvRcvInfo  = 32     // SCTP_RECVRCVINFO
	sctpSndInfo      = 2      // cmsg SCTP_SNDINFO
	sctpRcvInfo      = 3      // cmsg SCTP_RCVINFO
	msgNotification  = 0x8000 // MSG_NOTIFICATION
	sctpRcvInfoLen   = 28     // struct sctp_rcvinfo
	sctpSndInfoLen   = 16     // struct sctp_sndinfo
	sctpFlagsMask    = 0x000f // SCTP_UNORDERED and the other per-message flags
	sctpCmsgSpaceMax = 64
	sctpEvent        = 127    // SCTP_EVENT
	sctpAssocChange  = 0x8001 // SCTP_ASSOC_CHANGE
	sctpCommLost     = 1      // SCTP_COMM_LOST
	sctpShutdownComp = 3      // SCTP_SHUTDOWN_COMP
)

// subscribeAssocChange asks for a notification when the association of a
// one-to-one SCTP socket changes state. SCTP has no half-open state: once
// the proxy passes on one side's end, the other side's association shuts
// down too, and only this notification says so to a reader (the socket
// never reads as ended on the side that began the shutdown).
func subscribeAssocChange(fd int) {
	var ev [8]byte // struct sctp_event: assoc id, type, on
	binary.NativeEndian.PutUint16(ev[4:6], sctpAssocChange)
	ev[6] = 1
	_ = unix.SetsockoptString(fd, unix.IPPROTO_SCTP, sctpEvent, string(ev[:]))
}

// assocEnded reads a notification: whether it says the association ended
// (shut down, or lost).
func assocEnded(b []byte) (ended, lost bool) {
	if len(b) < 10 || binary.NativeEndian.Uint16(b[0:2]) != sctpAssocChange {
		return false, false
	}
	switch binary.NativeEndian.Uint16(b[8:10]) {
	case sctpShutdownComp:
		return true, false
	case sctpCommLost:
		return true, true
	}
	return false, false
}

// errAssocLost: an SCTP association was lost (its peer stopped answering).
var errAssocLost = errors.New("sctp association lost")

// buffers are the message buffers of the SCTP associations: one holds a
// buffer only while a message is in it, never while it waits.
var buffers = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

// copyMessages moves the messages of one direction of an SCTP
// association to the other, one message at a time, each with its stream
// and payload protocol identifier, until the source shuts down (or its
// association ends: see subscribeAssocChange); then it shuts the
// destination down. A message longer than maxDatagram goes on as several.
func copyMessages(src, dst side, act *activity, count *atomic.Uint64) error {
	oob := make([]byte, sctpCmsgSpaceMax)
	for {
		var bp *[]byte
		var n, oobn, flags int
		var rerr error
		err := src.rc.Read(func(fd uintptr) bool {
			bp = buffers.Get().(*[]byte)
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), *bp, oob, 0)
			if rerr == unix.EAGAIN {
				buffers.Put(bp)
				bp = nil
				return false
			}
			return true
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if act.expired(src, true) {
				return errIdle
			}
			continue
		case err != nil:
			return err
		case rerr != nil:
			buffers.Put(bp)
			return os.NewSyscallError("recvmsg", rerr)
		}
		if flags&msgNotification != 0 {
			ended, lost := assocEnded((*bp)[:n])
			buffers.Put(bp)
			switch {
			case lost:
				return errAssocLost
			case ended:
				return shutdownWrite(dst)
			}
			continue
		}
		if n == 0 {
			buffers.Put(bp)
			return shutdownWrite(dst)
		}
		err = sendMessage(dst, (*bp)[:n], sndInfo(oob[:oobn]), act)
		buffers.Put(bp)
		if err != nil {
			return err
		}
		count.Add(uint64(n))
		act.touch()
	}
}

// sndInfo turns the receive information of a message into the send
// information that gives it the same stream, protocol identifier and
// flags, as a control message.
func sndInfo(oob []byte) []byte {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		if m.Header.Level != unix.IPPROTO_SCTP || m.Header.Type != sctpRcvInfo || len(m.Data) < sctpRcvInfoLen {
			continue
		}
		sid := binary.NativeEndian.Uint16(m.Data[0:2])
		flags := binary.NativeEndian.Uint16(m.Data[4:6]) & sctpFlagsMask
		return sndInfoCmsg(sid, flags, [4]byte(m.Data[8:12]))
	}
	return nil
}

// sndInfoCmsg returns the control message that sends a message on stream
// sid with flags and payload protocol identifier ppid (as it travels).
func sndInfoCmsg(sid, flags uint16, ppid [4]byte) []byte {
	var info [sctpSndInfoLen]byte
	binary.NativeEndian.PutUint16(info[0:2], sid)
	binary.NativeEndian.PutUint16(info[2:4], flags)
	copy(info[4:8], ppid[:])
	b := make([]byte, unix.CmsgSpace(sctpSndInfoLen))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_SCTP, sctpSndInfo
	h.SetLen(unix.CmsgLen(sctpSndInfoLen))
	copy(b[unix.CmsgLen(0):], info[:])
	return b
}

// rcvInfo reads the stream and payload protocol identifier of a
// received message out of its control messages.
func rcvInfo(oob []byte) (sid uint16, ppid [4]byte, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, ppid, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_SCTP && m.Header.Type == sctpRcvInfo && len(m.Data) >= sctpRcvInfoLen {
			return binary.NativeEndian.Uint16(m.Data[0:2]), [4]byte(m.Data[8:12]), true
		}
	}
	return 0, ppid, false
}

// sendMessage sends one message, waiting while the association's buffer
// is full.
func sendMessage(dst side, b, oob []byte, act *activity) error {
	for {
		var werr error
		err := dst.rc.Write(func(fd uintptr) bool {
			_, werr = unix.SendmsgN(int(fd), b, oob, nil, 0)
			return werr != unix.EAGAIN
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if act.expired(dst, false) {
				return errIdle
			}
			continue
		case err != nil:
			return err
		case werr == unix.EINTR:
			continue
		case werr != nil:
			return os.NewSyscallError("sendmsg", werr)
		}
		return nil
	}
}
