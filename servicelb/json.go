package servicelb

import (
	"encoding/json"
	"fmt"
	"time"
)

// The JSON encoding of the model is servicelb's own: the field names of
// the json tags, durations as Go duration strings ("3h", "90s"), and the
// defaults of WithDefaults. Agents that read services from files use it as
// it is, so that a file and the Go API mean the same.

// MarshalJSON writes the timeout as a duration string.
func (a SessionAffinity) MarshalJSON() ([]byte, error) {
	type wire struct {
		ClientIP bool   `json:"clientIP,omitempty"`
		Timeout  string `json:"timeout,omitempty"`
	}
	w := wire{ClientIP: a.ClientIP}
	if a.Timeout != 0 {
		w.Timeout = a.Timeout.String()
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the timeout as a duration string, such as "3h".
func (a *SessionAffinity) UnmarshalJSON(b []byte) error {
	var w struct {
		ClientIP bool            `json:"clientIP"`
		Timeout  json.RawMessage `json:"timeout"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*a = SessionAffinity{ClientIP: w.ClientIP}
	if len(w.Timeout) == 0 || string(w.Timeout) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(w.Timeout, &s); err != nil {
		return fmt.Errorf("affinity timeout %s: want a duration string such as \"3h\"", w.Timeout)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("affinity timeout: %w", err)
	}
	a.Timeout = d
	return nil
}

// UnmarshalJSON reads an endpoint. A document that leaves "ready" out
// means ready, and one that leaves "serving" out means serving as ready
// says, as a Kubernetes EndpointSlice's absent conditions do. (Go's zero
// Endpoint is not ready.)
func (e *Endpoint) UnmarshalJSON(b []byte) error {
	type plain Endpoint
	w := struct {
		*plain
		Ready   *bool `json:"ready"`
		Serving *bool `json:"serving"`
	}{plain: (*plain)(e)}
	*e = Endpoint{}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	e.Ready = w.Ready == nil || *w.Ready
	e.Serving = e.Ready
	if w.Serving != nil {
		e.Serving = *w.Serving
	}
	return nil
}
