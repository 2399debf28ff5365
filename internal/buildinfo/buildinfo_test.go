package buildinfo

import (
	"runtime/debug"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	const rev = "053057c7666781cc7bb9eba8a4ca981f62b88618"
	stamped := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v0.0.0-20261123190926-053057c76667+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}}
	devel := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}}
	trimmed := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "-trimpath", Value: "true"}}}
	treeCalls := 0
	tree := func(string) (Info, bool) {
		treeCalls++
		return Info{Version: "v0.0.0-tree", Revision: "tree-rev", Modified: true, Dir: "/src"}, true
	}
	for _, tc := range []struct {
		name           string
		linkV, linkR   string
		bi             *debug.BuildInfo
		want           Info
		wantTreeCalled bool
	}{
		{"go build stamp", "", "", stamped,
			Info{Version: stamped.Main.Version, Revision: rev, Modified: true, GoVersion: "go1.99", Source: SourceBuildInfo}, false},
		{"link flags win", "v1.2.3", "abc", stamped,
			Info{Version: "v1.2.3", Revision: "abc", GoVersion: "go1.99", Source: SourceLinkFlags}, false},
		{"link flags, dirty", "053057c-dirty", "abc", trimmed,
			Info{Version: "053057c-dirty", Revision: "abc", Modified: true, GoVersion: "go1.99", Source: SourceLinkFlags}, false},
		{"go run: the source tree", "", "", devel,
			Info{Version: "v0.0.0-tree", Revision: "tree-rev", Modified: true, GoVersion: "go1.99", Source: SourceSourceTree, Dir: "/src"}, true},
		{"trimpath: no source tree to ask", "", "", trimmed,
			Info{Version: Unknown, Revision: Unknown, GoVersion: "go1.99"}, false},
		{"go install @version", "", "", &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{{Key: "-trimpath", Value: "true"}}},
			Info{Version: "v1.4.0", Revision: Unknown, GoVersion: "go1.99"}, false},
	} {
		treeCalls = 0
		if got := resolve(tc.linkV, tc.linkR, tc.bi, tree); got != tc.want || (treeCalls > 0) != tc.wantTreeCalled {
			t.Errorf("%s: %+v (tree asked: %v), want %+v", tc.name, got, treeCalls > 0, tc.want)
		}
	}
}

func TestPseudoVersion(t *testing.T) {
	at := time.Date(2026, 11, 23, 19, 9, 26, 0, time.FixedZone("x", 3600))
	if got := PseudoVersion("053057c7666781cc7bb9eba8a4ca981f62b88618", at, true); got != "v0.0.0-20261123180926-053057c76667+dirty" {
		t.Errorf("PseudoVersion = %s", got)
	}
}
