// Package docs holds only this test: every relative link in the
// repository's Markdown resolves to a file, and every #anchor to a heading
// of that file, as GitHub renders them. Pages move (README.md points into
// docs/, docs/protocols/ into docs/), and a link that silently 404s is the
// first thing a newcomer meets.
package docs

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// link is [text](target) or ![alt](target); target stops at a space (an
// optional "title") or the closing parenthesis.
var link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// inlineLink is a link inside a heading, whose slug keeps only the text.
var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// skipDirs are trees that hold other projects' Markdown.
var skipDirs = map[string]bool{".git": true, "node_modules": true, "vendor": true}

func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var pages []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skipDirs[d.Name()] {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 5 {
		t.Fatalf("found %d Markdown files under %s; expected README.md and docs/", len(pages), root)
	}
	anchors := map[string]map[string]bool{} // page → its heading slugs
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		a, err := headingSlugs(page)
		if err != nil {
			t.Fatal(err)
		}
		anchors[page] = a
		return a
	}
	checked := 0
	for _, page := range pages {
		lines, err := proseLines(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, l := range lines {
			for _, m := range link.FindAllStringSubmatch(l.text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %q: %v", rel, l.n, target, err)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link %q: no heading with anchor #%s in %s", rel, l.n, target, anchor, filepath.Base(dest))
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the pattern no longer matches the pages")
	}
}

type line struct {
	n    int
	text string
}

// proseLines returns the lines of a Markdown file outside fenced code
// blocks, where links are text.
func proseLines(path string) ([]line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []line
	fence := ""
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; s.Scan(); n++ {
		text := s.Text()
		trimmed := strings.TrimSpace(text)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		out = append(out, line{n, text})
	}
	return out, s.Err()
}

// headingSlugs returns the anchors GitHub gives a file's ATX headings.
func headingSlugs(path string) (map[string]bool, error) {
	lines, err := proseLines(path)
	if err != nil {
		return nil, err
	}
	slugs := map[string]bool{}
	seen := map[string]int{}
	for _, l := range lines {
		text := strings.TrimSpace(l.text)
		level := len(text) - len(strings.TrimLeft(text, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(text[level:], " ") {
			continue
		}
		s := slug(text[level:])
		if k := seen[s]; k > 0 {
			slugs[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			slugs[s] = true
		}
		seen[s]++
	}
	return slugs, nil
}

// slug is GitHub's heading anchor: lower case, letters, digits, spaces,
// hyphens and underscores kept, spaces turned into hyphens.
func slug(heading string) string {
	heading = inlineLink.ReplaceAllString(strings.TrimSpace(heading), "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"§2.2 Destination (one required)":                    "22-destination-one-required",
		"§4.2 Stage `ingest`: moved at once, never stored":   "42-stage-ingest-moved-at-once-never-stored",
		"Through the bridge at 10 M, with the file reopened": "through-the-bridge-at-10-m-with-the-file-reopened",
		"Rebus's external timeout manager":                   "rebuss-external-timeout-manager",
		"See [the contract](contract.md) first":              "see-the-contract-first",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}
