// Package buildinfo names the running build: its version, VCS revision and
// Go version, for `delaybridge version` and the delaybridge_build_info metric
// (docs/contract.md §5.5, §6.2).
//
// Sources, the first that knows winning:
//
//  1. link flags, for builds without .git (the container image):
//     -ldflags "-X github.com/delaybridge/delaybridge/internal/buildinfo.version=V
//     -X github.com/delaybridge/delaybridge/internal/buildinfo.revision=R";
//  2. what `go build` stamps (runtime/debug.ReadBuildInfo: the main module's
//     version, vcs.revision and vcs.modified), and `go install …@vX` (version);
//  3. for a build that carries no stamp (`go run`, a git worktree, or
//     -buildvcs=false) and was not built with -trimpath: git, asked at run
//     time about the source directory the binary was compiled from. Exact for
//     `go run`; for a binary built earlier it is the tree's revision now,
//     which Info.Source says.
package buildinfo

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Set by the linker (-X); empty otherwise.
var (
	version  string
	revision string
)

// Unknown is the value of a field no source knows.
const Unknown = "unknown"

// Sources of Info.Source.
const (
	SourceLinkFlags  = "link flags"
	SourceBuildInfo  = "go build stamp"
	SourceSourceTree = "source tree"
)

// Info names a build.
type Info struct {
	Version   string // a module version, e.g. v1.2.0 or v0.0.0-20261123190926-053057c76667+dirty
	Revision  string // the full VCS commit hash
	Modified  bool   // built from a tree with uncommitted changes
	GoVersion string
	// Source is where Revision came from (a Source… constant), "" when
	// unknown. With SourceSourceTree, Dir is the tree.
	Source string
	Dir    string
}

var get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, revision, bi, sourceTree)
})

// Get returns this binary's Info. The first call may run git (source 3).
func Get() Info { return get() }

// resolve applies the order of the package comment. bi may be nil.
func resolve(linkedVersion, linkedRevision string, bi *debug.BuildInfo, tree func(dir string) (Info, bool)) Info {
	info := Info{GoVersion: runtime.Version()}
	trimmed := false
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision, info.Source = s.Value, SourceBuildInfo
			case "vcs.modified":
				info.Modified, _ = strconv.ParseBool(s.Value)
			case "-trimpath":
				trimmed = s.Value == "true"
			}
		}
	}
	if linkedVersion != "" {
		info.Version = linkedVersion
	}
	if linkedRevision != "" {
		info.Revision, info.Source, info.Modified = linkedRevision, SourceLinkFlags, strings.HasSuffix(linkedVersion, "dirty") // git describe --dirty, or a pseudo-version +dirty
	}
	if info.Revision == "" && !trimmed && tree != nil {
		if dir := sourceDir(); dir != "" {
			if t, ok := tree(dir); ok {
				info.Revision, info.Modified, info.Source, info.Dir = t.Revision, t.Modified, SourceSourceTree, t.Dir
				if info.Version == "" {
					info.Version = t.Version
				}
			}
		}
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Revision == "" {
		info.Revision = Unknown
	}
	return info
}

// sourceDir is the directory this file was compiled from, when the binary
// records absolute paths (no -trimpath) and it still exists.
func sourceDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return ""
	}
	dir := filepath.Dir(file)
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	return dir
}

// sourceTree asks git about the tree holding dir: its HEAD and whether it has
// changes, with the version `go build` would stamp for a repository without
// tags (a pseudo-version).
func sourceTree(dir string) (Info, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	git := func(args ...string) (string, bool) {
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", dir, "-c", "log.showsignature=false"}, args...)...).Output()
		return strings.TrimSpace(string(out)), err == nil
	}
	head, ok := git("log", "-1", "--format=%H %ct")
	if !ok {
		return Info{}, false
	}
	rev, ct, _ := strings.Cut(head, " ")
	secs, err := strconv.ParseInt(ct, 10, 64)
	if err != nil || len(rev) < 12 {
		return Info{}, false
	}
	status, ok := git("status", "--porcelain")
	if !ok {
		return Info{}, false
	}
	top, ok := git("rev-parse", "--show-toplevel")
	if !ok {
		return Info{}, false
	}
	info := Info{Revision: rev, Modified: status != "", Dir: top}
	info.Version = PseudoVersion(rev, time.Unix(secs, 0), info.Modified)
	return info, true
}

// PseudoVersion is the version `go build` stamps on a build from revision
// rev, committed at t, of a repository without version tags.
func PseudoVersion(rev string, t time.Time, modified bool) string {
	v := "v0.0.0-" + t.UTC().Format("20060102150405") + "-" + rev[:min(12, len(rev))]
	if modified {
		v += "+dirty"
	}
	return v
}
