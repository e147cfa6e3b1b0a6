package soak

import (
	"encoding/json"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The commands.
const (
	opConfig = "config" // the first line: what to run
	opUpsert = "upsert" // add or replace Service
	opDelete = "delete" // delete the service Name
	opSynced = "synced" // the source has delivered its initial contents
	opSettle = "settle" // report Seq once everything so far is applied
)

// command is one line of the proxier's input.
type command struct {
	Op      string             `json:"op"`
	Config  *proxierConfig     `json:"config,omitempty"`
	Service *servicelb.Service `json:"service,omitempty"`
	Name    string             `json:"name,omitempty"`
	Seq     int                `json:"seq,omitempty"`
}

// proxierConfig says what the proxier process runs.
type proxierConfig struct {
	Backend        string               `json:"backend"`
	Node           servicelb.NodeConfig `json:"node"`
	VerifyInterval time.Duration        `json:"verifyInterval,omitempty"`
}

// The events.
const (
	evSync    = "sync"    // a sync attempt: Start, Duration, Services, QueuedAt, Full, Err
	evStats   = "stats"   // Goroutines, HeapLive
	evLog     = "log"     // a log record of Info or above: Log
	evSettled = "settled" // everything sent before settle Seq is applied
	evError   = "error"   // a command the proxier refused: Err
)

// event is one line of the proxier's output.
type event struct {
	Kind       string          `json:"kind"`
	Start      time.Time       `json:"start,omitzero"`
	Duration   time.Duration   `json:"duration,omitempty"`
	Services   int             `json:"services,omitempty"`
	QueuedAt   time.Time       `json:"queuedAt,omitzero"`
	Full       bool            `json:"full,omitempty"`
	Err        string          `json:"err,omitempty"`
	Goroutines int             `json:"goroutines,omitempty"`
	HeapLive   uint64          `json:"heapLive,omitempty"`
	Log        json.RawMessage `json:"log,omitempty"`
	Seq        int             `json:"seq,omitempty"`
}
