package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindBridge(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "delaybridge")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	if got, err := findBridge("delaybridge"); err != nil || got != exe {
		t.Errorf("--bridge delaybridge: %q, %v; want %q (a path, not a $PATH lookup)", got, err, exe)
	}
	if _, err := findBridge("missing"); err == nil || !strings.HasPrefix(err.Error(), "--bridge:") {
		t.Errorf("--bridge missing: %v", err)
	}
	t.Setenv("PATH", dir)
	if got, err := findBridge(""); err != nil || got != exe {
		t.Errorf("on $PATH: %q, %v; want %q", got, err, exe)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := findBridge(""); err == nil || !strings.Contains(err.Error(), "go build -o delaybridge .") {
		t.Errorf("none: %v", err)
	}
}

func TestParseInts(t *testing.T) {
	got, err := parseInts(" 1000, 2000,,3000 ")
	if err != nil || len(got) != 3 || got[0] != 1000 || got[2] != 3000 {
		t.Errorf("parseInts: %v, %v; want [1000 2000 3000]", got, err)
	}
	for _, bad := range []string{"1000,x", "0", "-5"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q): no error", bad)
		}
	}
	if got := joinInts([]int{1000, 2000}); got != "1000,2000" {
		t.Errorf("joinInts = %q", got)
	}
}
