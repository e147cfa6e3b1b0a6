//go:build linux

package iptables

import (
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Render returns the rules a Proxier with options o would write for st,
// as Proxier.Render prints them. It opens no socket and needs no
// privileges: for dry runs, and to look at a state from any machine.
func Render(st *servicelb.State, o Options) (string, error) {
	px, err := ForRendering(o)
	if err != nil {
		return "", err
	}
	return px.Render(st)
}

// renderFamily returns one family's tables as iptables-save prints them.
func renderFamily(want map[xtables.Table]*xtables.TableContent, f servicelb.Family) (string, error) {
	nat, filter := familyTables(f)
	if want[nat] == nil {
		return "", fmt.Errorf("iptables: render: family %s is not programmed", f)
	}
	b := xtables.AppendSaveTable(nil, nat.Family, want[filter].Text(xtables.Filter))
	b = xtables.AppendSaveTable(b, nat.Family, want[nat].Text(xtables.NAT))
	return string(b), nil
}
