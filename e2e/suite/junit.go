package suite

import (
	"encoding/xml"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// The JUnit report as ginkgo writes it, the parts the report reads.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name  string      `xml:"name,attr"`
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string        `xml:"name,attr"`
	Status  string        `xml:"status,attr"`
	Time    string        `xml:"time,attr"`
	Skipped *junitMessage `xml:"skipped"`
	Failure *junitFailure `xml:"failure"`
	Error   *junitFailure `xml:"error"`
	Out     string        `xml:"system-out,omitempty"`
	Err     string        `xml:"system-err,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// Result is one spec's outcome.
type Result struct {
	// Spec is the spec's full text, such as "[sig-network] Services
	// should serve a basic endpoint from pods [Conformance]".
	Spec string
	// Outcome is passed, failed or skipped.
	Outcome string
	// Reason is a skip's reason, or a failure's message.
	Reason string
	// Log is a failure's whole output.
	Log string
	// Seconds is how long it ran.
	Seconds string

	// a failure's parts, as the report has them
	message, details, output string
}

// The outcomes.
const (
	Passed  = "passed"
	Failed  = "failed"
	Skipped = "skipped"
)

// labelList matches the labels ginkgo appends to a test case's name, such
// as " [sig-network, Conformance]": every spec of the focus has the label
// of its SIG first.
var labelList = regexp.MustCompile(` \[sig-[^\[\]]*\]$`)

// specText returns a test case's spec text: the name without ginkgo's
// node type ("[It] ") and without the label list it appends.
func specText(name string, labels bool) string {
	name = strings.TrimPrefix(name, "[It] ")
	if labels {
		name = labelList.ReplaceAllString(name, "")
	}
	return strings.TrimSpace(name)
}

// readJUnit reads the outcome of every spec a report holds that ran, or
// that skipped itself with a reason: specs the focus left out are not
// results. Suite-level nodes ([SynchronizedBeforeSuite] and the like)
// that failed are results too: a failed setup fails every spec.
func readJUnit(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Result
	for _, su := range s.Suites {
		for _, c := range su.Cases {
			r, ok := result(c)
			if ok {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func result(c junitCase) (Result, bool) {
	it := strings.HasPrefix(c.Name, "[It] ")
	r := Result{Spec: specText(c.Name, it), Seconds: c.Time}
	switch {
	case c.Failure != nil || c.Error != nil || c.Status == "failed" || c.Status == "panicked" || c.Status == "timedout" || c.Status == "interrupted":
		f := c.Failure
		if f == nil {
			f = c.Error
		}
		if f == nil {
			f = &junitFailure{Message: c.Status}
		}
		r.Outcome, r.Reason = Failed, firstLine(f.Message)
		r.message, r.details, r.output = f.Message, f.Text, c.Out+c.Err
		r.Log = f.Message + "\n\n" + f.Text + "\n\n--- output\n" + r.output
		return r, true
	case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
		msg := ""
		if c.Skipped != nil {
			msg = strings.TrimSpace(strings.TrimPrefix(c.Skipped.Message, "skipped"))
			msg = strings.TrimSpace(strings.TrimPrefix(msg, "-"))
		}
		if !it || msg == "" {
			return r, false // left out by the focus, or a suite node
		}
		r.Outcome, r.Reason = Skipped, firstLine(msg)
		return r, true
	default:
		if !it {
			return r, false
		}
		r.Outcome = Passed
		return r, true
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
