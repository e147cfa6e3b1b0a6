package nl

// answer follows the messages of one request's answer (Socket.Answer).
type answer struct {
	seq  uint32
	f    func(Message) error
	ferr error // f's first error
	intr bool  // a message was marked NLM_F_DUMP_INTR
}

// take handles one received message: done at the end of the answer,
// with its outcome.
func (a *answer) take(m Message) (done bool, err error) {
	if m.Seq != a.seq {
		return false, nil
	}
	a.intr = a.intr || m.Flags&DumpIntr != 0
	switch m.Type {
	case TypeDone, TypeError:
		// Both carry an errno: an NLMSG_DONE's tells a dump cut short
		// (an old kernel's may carry none), an NLMSG_ERROR's the refusal.
		if err := ParseAck(m); err != nil && (m.Type == TypeError || len(m.Data) >= 4) {
			return true, err
		}
		if a.ferr == nil && a.intr {
			a.ferr = ErrDumpInterrupted
		}
		return true, a.ferr
	}
	if a.ferr == nil {
		a.ferr = a.f(m)
	}
	return false, nil
}
