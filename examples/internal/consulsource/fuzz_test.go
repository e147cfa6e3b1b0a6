package consulsource

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/consul/api"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// FuzzTranslate: any health entries Consul could return (decoded from
// JSON), with or without a mapping, translate without panic, the same way
// every time, into a service that servicelb validates or refuses with a
// *ValidationError.
func FuzzTranslate(f *testing.F) {
	entries, err := json.Marshal([]*api.ServiceEntry{
		entry("a", "10.0.0.1", 8080, vipMeta, api.HealthPassing),
		entry("b", "10.0.0.2", 8080, vipMeta, api.HealthWarning, api.HealthPassing),
		entry("c", "", 8080, vipMeta, api.HealthCritical),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(entries, "", uint16(0), "", false)
	f.Add(entries, "10.96.0.30", uint16(53), "UDP", true)
	f.Add([]byte(`[{"Node":{"Address":"fd00::1"},"Service":{"Port":80,"Meta":{"kproxy-vip":"fd00:96::1"}}}]`), "", uint16(0), "", false)
	node := servicelb.NodeConfig{NodeName: "n1"}
	f.Fuzz(func(t *testing.T, entriesJSON []byte, vip string, port uint16, proto string, warningReady bool) {
		var es []*api.ServiceEntry
		if json.Unmarshal(entriesJSON, &es) != nil {
			return
		}
		o := Options{WarningReady: warningReady}
		if vip != "" {
			o.Mapping = map[string]Mapping{"web": {VIP: vip, Port: port, Protocol: proto}}
		}
		a, errA := Translate("web", es, o)
		b, errB := Translate("web", es, o)
		if diff := cmp.Diff(a, b, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" || fmt.Sprint(errA) != fmt.Sprint(errB) {
			t.Fatalf("two translations differ: %v / %v\n%s", errA, errB, diff)
		}
		if errA != nil {
			return
		}
		bld, err := servicelb.NewBuilder(node)
		if err != nil {
			t.Fatal(err)
		}
		var ve *servicelb.ValidationError
		if err := bld.Upsert(a); err != nil && !errors.As(err, &ve) {
			t.Fatalf("servicelb refuses the translation without saying where: %v", err)
		}
	})
}
