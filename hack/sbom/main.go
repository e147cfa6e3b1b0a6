// Command kproxy-sbom writes the SPDX 2.3 software bill of materials of a
// kproxy release from the binaries' own module information (the build
// info Go links into them): kproxy's modules at the release's version,
// every module it links at the version and checksum the build used, the
// Go toolchain, and each binary with its SHA-256. Its output depends on
// nothing but its arguments, so that a release is reproducible.
//
//	kproxy-sbom -version v0.1.0 -created 1764374400 dist/kproxy-v0.1.0-linux-amd64 dist/kproxy-v0.1.0-linux-arm64
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ownModules are kproxy's modules: built from the release's tree, they
// carry its version.
const ownModules = "github.com/kproxy-dev/kproxy"

func main() {
	version := flag.String("version", "", "the release's version, such as v0.1.0")
	created := flag.Int64("created", 0, "the document's creation time, in seconds since the epoch (the release commit's)")
	flag.Parse()
	if err := run(os.Stdout, *version, time.Unix(*created, 0).UTC(), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-sbom:", err)
		os.Exit(1)
	}
}

type document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      creationInfo   `json:"creationInfo"`
	Packages          []pkg          `json:"packages"`
	Files             []file         `json:"files"`
	Relationships     []relationship `json:"relationships"`
}

type creationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type pkg struct {
	Name             string     `json:"name"`
	SPDXID           string     `json:"SPDXID"`
	VersionInfo      string     `json:"versionInfo"`
	DownloadLocation string     `json:"downloadLocation"`
	FilesAnalyzed    bool       `json:"filesAnalyzed"`
	Comment          string     `json:"comment,omitempty"`
	ExternalRefs     []extRef   `json:"externalRefs,omitempty"`
	Checksums        []checksum `json:"checksums,omitempty"`
}

type extRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type file struct {
	Name      string     `json:"fileName"`
	SPDXID    string     `json:"SPDXID"`
	Checksums []checksum `json:"checksums"`
}

type relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

var idChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + idChars.ReplaceAllString(name, "-")
}

func run(w io.Writer, version string, created time.Time, binaries []string) error {
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(version) {
		return fmt.Errorf("-version %q: want a semantic version such as v0.1.0", version)
	}
	if len(binaries) == 0 {
		return fmt.Errorf("no binary named")
	}
	doc := document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              "kproxy-" + version,
		DocumentNamespace: "https://github.com/kproxy-dev/kproxy/releases/" + version + "/sbom",
		CreationInfo:      creationInfo{Created: created.Format(time.RFC3339), Creators: []string{"Tool: kproxy-sbom"}},
	}
	var mods map[string]pkg
	var mainID string
	for _, bin := range binaries {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("%s: %w", bin, err)
		}
		got := map[string]pkg{}
		add := func(path, v, sum string) {
			if strings.HasPrefix(path, ownModules) && (v == "(devel)" || v == "") {
				v = version
			}
			p := pkg{Name: path, SPDXID: spdxID("Package", path), VersionInfo: v, DownloadLocation: "NOASSERTION",
				ExternalRefs: []extRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + path + "@" + v}}}
			if sum != "" {
				p.Comment = "go.sum " + sum
			}
			got[path] = p
		}
		add(info.Main.Path, info.Main.Version, info.Main.Sum)
		for _, d := range info.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			add(d.Path, d.Version, d.Sum)
		}
		got["go"] = pkg{Name: "go", SPDXID: "SPDXRef-Package-go", VersionInfo: info.GoVersion, DownloadLocation: "https://go.dev/dl/",
			ExternalRefs: []extRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/stdlib@" + info.GoVersion}}}
		if mods == nil {
			mods, mainID = got, spdxID("Package", info.Main.Path)
		} else if !sameModules(mods, got) {
			return fmt.Errorf("%s links other modules than %s", bin, binaries[0])
		}
		sum, err := fileSHA256(bin)
		if err != nil {
			return err
		}
		name := filepath.Base(bin)
		doc.Files = append(doc.Files, file{Name: name, SPDXID: spdxID("File", name), Checksums: []checksum{{"SHA256", sum}}})
		doc.Relationships = append(doc.Relationships, relationship{mainID, "GENERATES", spdxID("File", name)})
	}
	names := slices.Sorted(maps.Keys(mods))
	doc.Relationships = append([]relationship{{"SPDXRef-DOCUMENT", "DESCRIBES", mainID}}, doc.Relationships...)
	for _, n := range names {
		doc.Packages = append(doc.Packages, mods[n])
		if id := mods[n].SPDXID; id != mainID {
			doc.Relationships = append(doc.Relationships, relationship{mainID, "DEPENDS_ON", id})
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

func sameModules(a, b map[string]pkg) bool {
	if len(a) != len(b) {
		return false
	}
	for n, p := range a {
		if q, ok := b[n]; !ok || q.VersionInfo != p.VersionInfo || q.Comment != p.Comment {
			return false
		}
	}
	return true
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
