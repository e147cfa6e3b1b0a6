package ipset

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Restore renders a set and its entries as `ipset restore` input, with
// the kernel name prefix+s.Name: for dry runs, logs and golden tests. The
// set and entries are validated as Create and Add would.
func Restore(prefix string, s Set, entries []Entry) (string, error) {
	if err := validateSet(prefix, s); err != nil {
		return "", err
	}
	valid, err := validateAll(&s, entries)
	if err != nil {
		return "", err
	}
	name := prefix + s.Name
	var b strings.Builder
	b.WriteString("create " + name + " " + string(s.Type) + createOptions(s) + "\n")
	for _, e := range valid {
		b.WriteString("add " + name + " " + e.String())
		if e.Timeout != 0 {
			b.WriteString(" timeout " + strconv.Itoa(int(e.Timeout/time.Second)))
		}
		if e.Comment != "" {
			fmt.Fprintf(&b, " comment %q", e.Comment)
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

func createOptions(s Set) string {
	var o []string
	if s.Type == BitmapPort {
		o = append(o, fmt.Sprintf("range %d-%d", s.PortFrom, s.PortTo))
	} else {
		o = append(o, "family "+s.Family.String())
	}
	if s.HashSize != 0 {
		o = append(o, "hashsize "+strconv.Itoa(int(s.HashSize)))
	}
	if s.MaxElem != 0 {
		o = append(o, "maxelem "+strconv.Itoa(int(s.MaxElem)))
	}
	if s.Timeout != 0 {
		o = append(o, "timeout "+strconv.Itoa(int(s.Timeout/time.Second)))
	}
	if s.Counters {
		o = append(o, "counters")
	}
	if s.Comment {
		o = append(o, "comment")
	}
	return " " + strings.Join(o, " ")
}
