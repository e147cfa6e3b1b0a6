package servicelb

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzValidate feeds arbitrary services, as JSON, through validation and
// compilation. Whatever the input: validation never panics; an error is a
// join of *ValidationError; and a service it accepts compiles into ports
// whose backends are all of the port's family and drawn from the
// service's endpoints.
func FuzzValidate(f *testing.F) {
	for _, seed := range []string{
		`{"name":"default/web","clusterIPs":["10.96.0.10","fd00::10"],"ports":[{"name":"http","protocol":"TCP","port":80,"nodePort":30080}],"endpoints":[{"addr":"10.244.1.2","ready":true}]}`,
		`{"name":"x","externalIPs":["192.0.2.1"],"ports":[{"protocol":"UDP","port":53,"targetPort":5353}],"affinity":{"clientIP":true,"timeout":1000000000}}`,
		`{"name":"","ports":[{"protocol":"ICMP","port":0}]}`,
		`{"name":"a/b","clusterIPs":["0.0.0.0"],"ports":[{"protocol":"SCTP","port":9}],"endpoints":[{"addr":"fd00::1","ready":false,"serving":true,"terminating":true,"weight":0}]}`,
	} {
		f.Add([]byte(seed))
	}
	node := NodeConfig{NodeName: "n1", Zone: "z1"}
	f.Fuzz(func(t *testing.T, data []byte) {
		var s Service
		if json.Unmarshal(data, &s) != nil {
			return
		}
		err := Validate(&node, &s)
		if err != nil {
			checkJoinedValidation(t, err)
			if _, err2 := NewState(node, s); err2 == nil {
				t.Fatal("NewState accepted what Validate refused")
			}
			return
		}
		st, err := NewState(node, s)
		if err != nil {
			checkJoinedValidation(t, err)
			return
		}
		for _, sp := range st.Ports() {
			for _, b := range append(sp.Cluster, sp.Local...) {
				if FamilyOf(b.Addr) != sp.Family || b.Weight == 0 || b.Port == 0 {
					t.Fatalf("%s: bad backend %+v", sp.Key, b)
				}
			}
		}
	})
}

func checkJoinedValidation(t *testing.T, err error) {
	t.Helper()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, e := range errs {
		var ve *ValidationError
		if !errors.As(e, &ve) || ve.Err == nil || ve.Field == "" {
			t.Fatalf("error %q (%T) is not a complete *ValidationError", e, e)
		}
	}
}
