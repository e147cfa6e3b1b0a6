package conntrack

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"github.com/kproxy-dev/kproxy/internal/sysctl"
)

// Tuning holds kube-proxy's conntrack settings (its configuration's
// conntrack section). kproxy writes none of them unless asked: Apply
// writes those set. The zero value of a field leaves the kernel's value
// alone.
type Tuning struct {
	// MaxPerCore and Min set net.netfilter.nf_conntrack_max to
	// max(MaxPerCore × CPUs, Min), when MaxPerCore is set, and raise the
	// table's hash size to a quarter of it. (kube-proxy's defaults: 32768
	// and 131072.)
	MaxPerCore, Min int
	// TCPEstablishedTimeout sets nf_conntrack_tcp_timeout_established
	// (kube-proxy: 24h).
	TCPEstablishedTimeout time.Duration
	// TCPCloseWaitTimeout sets nf_conntrack_tcp_timeout_close_wait
	// (kube-proxy: 1h).
	TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal, so that conntrack
	// does not mark out-of-window TCP packets invalid.
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout and
	// nf_conntrack_udp_timeout_stream.
	UDPTimeout, UDPStreamTimeout time.Duration
}

// Setting is a kernel setting Apply changed.
type Setting struct {
	// Name is the sysctl's dotted name.
	Name string
	// Value is the value written, Old the one it replaced.
	Value, Old string
}

// ErrInvalidTuning: a negative value, or a timeout that is not a whole
// number of seconds.
var ErrInvalidTuning = errors.New("invalid conntrack tuning")

// ErrNotNamespaced: the kernel lets only the initial network namespace
// change the setting (nf_conntrack_max and the hash size are global);
// other namespaces see it read-only.
var ErrNotNamespaced = errors.New("only the initial network namespace can set it")

// hashSizeFile is the conntrack table's hash size, a module parameter.
const hashSizeFile = "/sys/module/nf_conntrack/parameters/hashsize"

// Validate checks the values.
func (t Tuning) Validate() error {
	var errs []error
	for name, v := range map[string]int{"MaxPerCore": t.MaxPerCore, "Min": t.Min} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%w: %s %d is negative", ErrInvalidTuning, name, v))
		}
	}
	for name, d := range map[string]time.Duration{"TCPEstablishedTimeout": t.TCPEstablishedTimeout,
		"TCPCloseWaitTimeout": t.TCPCloseWaitTimeout, "UDPTimeout": t.UDPTimeout, "UDPStreamTimeout": t.UDPStreamTimeout} {
		if d < 0 || d%time.Second != 0 {
			errs = append(errs, fmt.Errorf("%w: %s %v is not a whole, non-negative number of seconds", ErrInvalidTuning, name, d))
		}
	}
	return errors.Join(errs...)
}

// Max returns the nf_conntrack_max that MaxPerCore and Min call for on a
// machine with cpus CPUs, or 0 when MaxPerCore is not set.
func (t Tuning) Max(cpus int) int {
	if t.MaxPerCore == 0 {
		return 0
	}
	return max(t.MaxPerCore*cpus, t.Min)
}

// settings returns the sysctls t sets, the table's size first.
func (t Tuning) settings() []sysctl.Setting {
	var out []sysctl.Setting
	add := func(name string, v int64) {
		out = append(out, sysctl.Setting{Name: "net.netfilter." + name, Value: strconv.FormatInt(v, 10)})
	}
	if m := t.Max(runtime.NumCPU()); m > 0 {
		out = append(out, sysctl.Setting{Name: maxName, Value: strconv.Itoa(m)})
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{"nf_conntrack_tcp_timeout_established", t.TCPEstablishedTimeout},
		{"nf_conntrack_tcp_timeout_close_wait", t.TCPCloseWaitTimeout},
		{"nf_conntrack_udp_timeout", t.UDPTimeout},
		{"nf_conntrack_udp_timeout_stream", t.UDPStreamTimeout},
	} {
		if s.d > 0 {
			add(s.name, int64(s.d/time.Second))
		}
	}
	if t.TCPBeLiberal {
		add("nf_conntrack_tcp_be_liberal", 1)
	}
	return out
}

// Apply writes the settings t sets that differ from the kernel's, in the
// network namespace ns (zero: the caller's), and returns those it
// changed. The timeouts and tcp_be_liberal are the namespace's own. The
// table's size is the kernel's: only the initial namespace can set it, so
// that elsewhere it fails with ErrNotNamespaced, before anything global is
// touched, and the rest is applied all the same. Raising the size first
// raises the table's hash size to a quarter of it when it is smaller, as
// kube-proxy does.
func (t Tuning) Apply(ns netns.NsHandle) ([]Setting, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	var errs []error
	var out []Setting
	settings := t.settings()
	if m := t.Max(runtime.NumCPU()); m > 0 {
		settings = settings[1:]
		changed, err := t.setMax(ns, m)
		out = append(out, changed...)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack tuning: %w", err))
		}
	}
	changed, err := sysctl.Apply(ns, settings)
	for _, c := range changed {
		out = append(out, Setting{Name: c.Name, Value: c.Value, Old: c.Old})
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("conntrack tuning: %w", err))
	}
	return out, errors.Join(errs...)
}

// maxName is the sysctl of the table's size.
const maxName = "net.netfilter.nf_conntrack_max"

// setMax sets the table's size to m, and its hash size to m/4 first when
// smaller, if ns may: the kernel shows the size read-only to every
// namespace but the initial one.
func (t Tuning) setMax(ns netns.NsHandle, m int) ([]Setting, error) {
	var writable bool
	err := nsutil.Do(ns, func() error {
		fi, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max")
		writable = err == nil && fi.Mode().Perm()&0o200 != 0
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", maxName, err)
	}
	if !writable {
		return nil, fmt.Errorf("%s=%d: %w", maxName, m, ErrNotNamespaced)
	}
	var out []Setting
	b, err := os.ReadFile(hashSizeFile)
	if err != nil {
		return nil, fmt.Errorf("hash size: %w", err)
	}
	old := strings.TrimSpace(string(b))
	if n, err := strconv.Atoi(old); err == nil && n < m/4 {
		v := strconv.Itoa(m / 4)
		if err := os.WriteFile(hashSizeFile, []byte(v), 0o644); err != nil {
			return nil, fmt.Errorf("hash size %s: %w", v, err)
		}
		out = append(out, Setting{Name: "nf_conntrack.hashsize", Value: v, Old: old})
	}
	changed, err := sysctl.Apply(ns, []sysctl.Setting{{Name: maxName, Value: strconv.Itoa(m)}})
	for _, c := range changed {
		out = append(out, Setting{Name: c.Name, Value: c.Value, Old: c.Old})
	}
	return out, err
}
