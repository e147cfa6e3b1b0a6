package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/semver"
)

// nextFile is the API of the next release, in the api directory.
const nextFile = "next.txt"

const header = `# The exported API of kproxy's next release, one feature a line: make api
# rewrites the features from the code. A line "- <feature>" declares a
# feature of the last release (v*.txt) that the next one removes or
# changes; keep it // Deprecated: for one minor release first.
`

// apiFile is an api file's features and declared removals.
type apiFile struct {
	features, removed []string
}

func readFile(path string) (apiFile, error) {
	var f apiFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "", strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "- "):
			f.removed = append(f.removed, strings.TrimPrefix(line, "- "))
		default:
			f.features = append(f.features, line)
		}
	}
	return f, sc.Err()
}

// Write rewrites next.txt with features, keeping its declarations.
func Write(dir string, features []string) error {
	var removed []string
	if f, err := readFile(filepath.Join(dir, nextFile)); err == nil {
		removed = f.removed
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var b strings.Builder
	b.WriteString(header)
	for _, r := range removed {
		b.WriteString("- " + r + "\n")
	}
	for _, f := range features {
		b.WriteString(f + "\n")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, nextFile), []byte(b.String()), 0o644)
}

// Check compares features, the current API, with next.txt and the newest
// release's file.
func Check(dir string, features []string) error {
	next, err := readFile(filepath.Join(dir, nextFile))
	if err != nil {
		return fmt.Errorf("%w (make api writes it)", err)
	}
	var errs []error
	if added, gone := minus(features, next.features), minus(next.features, features); len(added)+len(gone) > 0 {
		errs = append(errs, fmt.Errorf("the exported API differs from %s (run make api, and review the change):\n%s",
			filepath.Join(dir, nextFile), lines("+ ", added)+lines("- ", gone)))
	}
	release, err := newestRelease(dir)
	if err != nil {
		return err
	}
	if release != "" {
		rel, err := readFile(release)
		if err != nil {
			return err
		}
		broken := minus(minus(rel.features, features), next.removed)
		if len(broken) > 0 {
			errs = append(errs, fmt.Errorf("an incompatible change of the API of %s, which %s does not declare "+
				"(add \"- <feature>\" lines for what the next release removes or changes):\n%s",
				filepath.Base(release), filepath.Join(dir, nextFile), lines("  ", broken)))
		}
	}
	if still := minus(next.removed, minus(next.removed, features)); len(still) > 0 {
		errs = append(errs, fmt.Errorf("%s declares removed what the API still has:\n%s",
			filepath.Join(dir, nextFile), lines("  ", still)))
	}
	return errors.Join(errs...)
}

// newestRelease returns the file of the newest release in dir, or "".
func newestRelease(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "v*.txt"))
	if err != nil {
		return "", err
	}
	newest := ""
	for _, f := range files {
		v := strings.TrimSuffix(filepath.Base(f), ".txt")
		if !semver.IsValid(v) {
			return "", fmt.Errorf("%s: not named after a release (vMAJOR.MINOR.PATCH.txt)", f)
		}
		if newest == "" || semver.Compare(v, strings.TrimSuffix(filepath.Base(newest), ".txt")) > 0 {
			newest = f
		}
	}
	return newest, nil
}

// minus returns the lines of a that b lacks.
func minus(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, l := range b {
		in[l] = true
	}
	var out []string
	for _, l := range a {
		if !in[l] {
			out = append(out, l)
		}
	}
	return out
}

func lines(prefix string, ls []string) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(prefix + l + "\n")
	}
	return b.String()
}
