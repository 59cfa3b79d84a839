package integration

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// TestRJavaV1: /v1 executions reach the R and Java kernels of the default
// template, streamed (stdout before the end, a plot, a data frame, an
// exception with its traceback), with state kept between executions; an
// execution's timeout interrupts the code and the context goes on; and
// `sheepfold run --lang r|java` runs a program.
func TestRJavaV1(t *testing.T) {
	s := start(t)
	ctx := context.Background()
	c := client.New(s.url, s.key)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)

	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "x <- 41\ndf <- data.frame(n = 1:3)", Language: "r"})
	if err != nil || ex.Status != client.StatusSuccess {
		t.Fatalf("r: %v %+v", err, ex)
	}
	var stdout []string
	var png, html bool
	ex, err = c.ExecuteStream(ctx, sb.ID, client.ExecuteRequest{Code: "cat('first\\n'); plot(df$n); df; x + 1", Language: "r"}, client.ExecuteHandlers{
		OnStdout: func(s string) { stdout = append(stdout, s) },
		OnResult: func(r client.Result) {
			png = png || r.PNG != ""
			html = html || strings.Contains(r.HTML, "<table")
		},
	})
	if err != nil || ex.Status != client.StatusSuccess || strings.Join(stdout, "") != "first\n" || !png || !html || mainOf(ex) != "[1] 42" {
		t.Fatalf("r streamed: %v %+v stdout %q png %v html %v", err, ex, stdout, png, html)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "f <- function() stop('nope')\nf()", Language: "r"})
	if err != nil || ex.Error == nil || ex.Error.Name != "simpleError" || ex.Error.Value != "nope" || !strings.Contains(ex.Error.Traceback, "f()") {
		t.Fatalf("r error: %v %+v", err, ex.Error)
	}

	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "int x = 41;", Language: "java"})
	if err != nil || ex.Status != client.StatusSuccess {
		t.Fatalf("java: %v %+v %+v", err, ex, ex.Error)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "while (true) {}", Language: "java", Timeout: 2 * time.Second})
	if err != nil || ex.Status != client.StatusTimeout {
		t.Fatalf("java timeout: %v %+v", err, ex)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "System.out.println(\"hi\"); x + 1", Language: "java"})
	if err != nil || mainOf(ex) != "42" || ex.Stdout != "hi\n" {
		t.Fatalf("java state after the timeout: %v %+v %+v", err, ex, ex.Error)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "Object o = null; o.toString()", Language: "java"})
	if err != nil || ex.Error == nil || ex.Error.Name != "NullPointerException" {
		t.Fatalf("java error: %v %+v", err, ex.Error)
	}

	for lang, prog := range map[string][2]string{
		"r":    {"cat(6 * 7, '\\n')\n", "42 \n"},
		"java": {"class Main { public static void main(String[] a) { System.out.println(6 * 7); } }\n", "42\n"},
	} {
		cmd := exec.Command(s.bin, "--data-dir", s.dataDir, "run", "--lang", lang, "-")
		cmd.Stdin = strings.NewReader(prog[0])
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != prog[1] {
			t.Fatalf("sheepfold run --lang %s: %v %q", lang, err, out)
		}
	}
}

// mainOf is the text of an execution's main result.
func mainOf(ex *client.Execution) string {
	for _, r := range ex.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}
