package agent

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// BuildInfo names the build of a binary, for --version. Fields left empty
// are read from the binary's own build information (runtime/debug): the
// module version and the VCS revision Go recorded, when it did.
type BuildInfo struct {
	// VersionText is the release, such as v0.3.0; set with
	// -ldflags "-X main.version=v0.3.0".
	VersionText string
	// Commit is the source revision; set with
	// -ldflags "-X main.commit=$(git rev-parse HEAD)".
	Commit string
	// read returns the binary's build information; nil means
	// debug.ReadBuildInfo.
	read func() (*debug.BuildInfo, bool)
}

// NewBuildInfo returns the build info of a binary whose version and commit
// were set at link time (empty when not).
func NewBuildInfo(version, commit string) BuildInfo {
	return BuildInfo{VersionText: version, Commit: commit}
}

func (b BuildInfo) info() *debug.BuildInfo {
	read := b.read
	if read == nil {
		read = debug.ReadBuildInfo
	}
	if bi, ok := read(); ok {
		return bi
	}
	return nil
}

// Version returns the version: the one set at link time, else the main
// module's (a tagged module built with go install has one), else
// "unknown".
func (b BuildInfo) Version() string {
	if b.VersionText != "" {
		return b.VersionText
	}
	if bi := b.info(); bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "unknown"
}

// Revision returns the commit: the one set at link time, else the VCS
// revision Go recorded (with "-dirty" for a modified tree), else
// "unknown".
func (b BuildInfo) Revision() string {
	if b.Commit != "" {
		return b.Commit
	}
	bi := b.info()
	if bi == nil {
		return "unknown"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "unknown"
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// Line is what --version prints: the name, version, commit, and the Go
// version and platform it was built with.
func (b BuildInfo) Line(name string) string {
	gover := runtime.Version()
	if bi := b.info(); bi != nil && bi.GoVersion != "" {
		gover = bi.GoVersion
	}
	return fmt.Sprintf("%s %s (commit %s, %s, %s/%s)", name, b.Version(), b.Revision(), gover, runtime.GOOS, runtime.GOARCH)
}
