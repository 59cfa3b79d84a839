package template

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultMirror is used when neither BuildOptions.Mirror nor the host's apt
// sources name a mirror for the suite.
const DefaultMirror = "http://deb.debian.org/debian"

// defaultMirror returns the first mirror in aptDir's sources.list and
// sources.list.d/*.list (one-line style) or sources.list.d/*.sources (deb822)
// that serves suite with binary packages over http(s), else DefaultMirror.
func defaultMirror(aptDir, suite string) string {
	files := []string{filepath.Join(aptDir, "sources.list")}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", pat))
		files = append(files, m...)
	}
	slices.Sort(files[1:])
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var uris []string
		if strings.HasSuffix(f, ".sources") {
			uris = deb822Mirrors(b, suite)
		} else {
			uris = oneLineMirrors(b, suite)
		}
		for _, u := range uris {
			if validMirror(u) == nil {
				return strings.TrimSuffix(u, "/")
			}
		}
	}
	return DefaultMirror
}

// oneLineMirrors parses "deb [options] uri suite component..." lines.
func oneLineMirrors(b []byte, suite string) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options, maybe with spaces
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			f = f[1:]
		}
		if len(f) >= 2 && f[1] == suite {
			out = append(out, f[0])
		}
	}
	return out
}

// deb822Mirrors parses the stanzas of a .sources file.
func deb822Mirrors(b []byte, suite string) []string {
	var out []string
	for _, stanza := range strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n\n") {
		fields := map[string]string{}
		key := ""
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if (strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t")) && key != "" {
				fields[key] += " " + strings.TrimSpace(line) // continuation
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			fields[key] = strings.TrimSpace(v)
		}
		if strings.EqualFold(fields["enabled"], "no") ||
			!slices.Contains(strings.Fields(fields["types"]), "deb") ||
			!slices.Contains(strings.Fields(fields["suites"]), suite) {
			continue
		}
		out = append(out, strings.Fields(fields["uris"])...)
	}
	return out
}

// validMirror accepts http, https and file URLs (debootstrap's schemes) and
// refuses anything that could pass for an option.
func validMirror(m string) error {
	u, err := url.Parse(m)
	if err != nil {
		return fmt.Errorf("invalid mirror %q: %w", m, err)
	}
	switch {
	case u.Scheme == "http" || u.Scheme == "https":
		if u.Host == "" {
			return fmt.Errorf("invalid mirror %q: no host", m)
		}
	case u.Scheme == "file":
		if u.Path == "" {
			return fmt.Errorf("invalid mirror %q: no path", m)
		}
	default:
		return fmt.Errorf("invalid mirror %q: want an http, https or file URL", m)
	}
	if strings.ContainsAny(m, " \t\n") {
		return fmt.Errorf("invalid mirror %q: contains white space", m)
	}
	return nil
}
