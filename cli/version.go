package cli

import (
	"flag"
	"fmt"
	"io"

	"github.com/delaybridge/delaybridge/internal/buildinfo"
)

// runVersion prints the build's version, VCS revision and Go version: the
// labels of delaybridge_build_info.
func runVersion(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	setUsage(fs, "version", "Prints the version, the VCS revision and the Go version of this build\n"+
		"(the labels of the delaybridge_build_info metric).")
	pos, code := parseFlags(fs, args, out, errOut)
	if code >= 0 {
		return code
	}
	if len(pos) > 0 {
		return usageErr(fs, errOut, "version", "unexpected argument %q", pos[0])
	}
	bi := buildinfo.Get()
	fmt.Fprintf(out, "delaybridge %s\n", bi.Version)
	modified := ""
	if bi.Modified {
		modified = " (modified)"
	}
	fmt.Fprintf(out, "revision %s%s\n", bi.Revision, modified)
	fmt.Fprintf(out, "go %s\n", bi.GoVersion)
	if bi.Source == buildinfo.SourceSourceTree {
		fmt.Fprintf(out, "(this build carries no VCS stamp: the revision is the one of %s now)\n", bi.Dir)
	}
	return exitOK
}
