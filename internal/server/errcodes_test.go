package server_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/apierr"
)

// TestEveryCodeHasItsErrorEverywhere walks the server's error codes
// (apierr.Status): each has its row in docs/errors.md with its HTTP
// status and the SDKs' names, its exception class in the Python SDK
// (error_for picks it by code, and it is exported), and its typed error
// in the Go SDK (client.Codes, matched with errors.Is).
func TestEveryCodeHasItsErrorEverywhere(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 8 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`ERR_") {
			continue
		}
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		rows[cells[1]] = cells[1:]
	}
	// The Python SDK, asked for its class of each code.
	var codes []string
	for c := range apierr.Status {
		codes = append(codes, string(c))
	}
	slices.Sort(codes)
	py := "import sys\nsys.path.insert(0, '../../sdk/python')\nimport sheepfold\nfrom sheepfold.errors import error_for\n" +
		"for c in sys.argv[1:]:\n    e = error_for(c, 'm', status=None)\n" +
		"    print(c, type(e).__name__, e.code == c, getattr(sheepfold, type(e).__name__, None) is type(e))\n"
	out, err := exec.Command("/usr/bin/python3", append([]string{"-c", py}, codes...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	pyClass := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("python3 said %q", line)
		}
		if f[2] != "True" || f[3] != "True" || f[1] == "SheepfoldError" {
			t.Errorf("Python SDK: %s raises %s (its code kept: %s, exported: %s); it needs its own class", f[0], f[1], f[2], f[3])
		}
		pyClass[f[0]] = f[1]
	}
	camel := regexp.MustCompile(`^Err[A-Z][A-Za-z]*$`)
	for _, c := range codes {
		status := apierr.Status[apierr.Code(c)]
		if !slices.Contains(client.Codes, client.Code(c)) {
			t.Errorf("Go SDK: %s has no client.Code in client.Codes", c)
		} else if !errors.Is(&client.Error{Code: c}, client.Code(c)) || errors.Is(&client.Error{Code: c}, client.Code("ERR_OTHER")) {
			t.Errorf("Go SDK: errors.Is does not match %s", c)
		}
		row, ok := rows[c]
		if !ok {
			t.Errorf("docs/errors.md has no row for %s", c)
			continue
		}
		if row[1] != strconv.Itoa(status) {
			t.Errorf("docs/errors.md: %s is %s, the server sends %d", c, row[1], status)
		}
		if row[4] != pyClass[c] {
			t.Errorf("docs/errors.md: %s's Python class is %q, the SDK raises %s", c, row[4], pyClass[c])
		}
		if !camel.MatchString(row[5]) || fmt.Sprint(goCode(row[5])) != c {
			t.Errorf("docs/errors.md: %s's Go error %q is not the client's", c, row[5])
		}
	}
	if len(rows) != len(codes) {
		t.Errorf("docs/errors.md lists %d codes, the server has %d", len(rows), len(codes))
	}
}

// goCode maps a client.ErrXxx name to its code.
func goCode(name string) client.Code {
	for _, c := range client.Codes {
		if "Err"+camelCase(string(c)) == name {
			return c
		}
	}
	return ""
}

// camelCase turns ERR_CPU_TIME_EXCEEDED into CPUTimeExceeded.
func camelCase(code string) string {
	var b strings.Builder
	for _, w := range strings.Split(strings.TrimPrefix(code, "ERR_"), "_") {
		if w == "CPU" {
			b.WriteString(w)
			continue
		}
		b.WriteString(w[:1] + strings.ToLower(w[1:]))
	}
	return b.String()
}
