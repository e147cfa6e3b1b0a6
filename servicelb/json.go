package servicelb

import (
	"encoding/json"
	"fmt"
	"time"
)

// The JSON encoding of the model is servicelb's own: the field names of
// the json tags, durations as Go duration strings ("3h", "90s"), and the
// defaults of WithDefaults. A field a document leaves out is the Go zero
// value, and means what that means in Go (an endpoint's nil Ready is
// ready), so that json.Marshal of a Service reads back as the same
// Service. Agents that read services from files use it as it is, so that
// a file and the Go API mean the same.

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
