package kernel

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestR: state between executions, printed and visible values, data
// frames as text and HTML, plots as PNG, errors with name, value and
// traceback, warnings on stderr, an execution's env and its end.
func TestR(t *testing.T) {
	t.Parallel()
	k := start(t, "r", nil)
	if r := run(t, k, code("x <- 41")); r.done.Status != agentproto.StatusOK || len(r.results) != 0 || r.err != nil {
		t.Fatalf("x <- 41: %+v", r)
	}
	if r := run(t, k, code("x + 1")); main(r) != "[1] 42" {
		t.Fatalf("state: %+v", r)
	}
	// E2B's test_r_kernel: print writes to stdout and has no value.
	if r := run(t, k, code(`print("Hello, World!")`)); r.stdout != "[1] \"Hello, World!\"\n" || len(r.results) != 0 {
		t.Fatalf("print: %+v", r)
	}
	r := run(t, k, code("cat('out\\n'); message('err'); 1; df <- data.frame(n = 1:2, s = c('a', '<b>')); df"))
	if r.stdout != "out\n" || r.stderr != "err\n" || len(r.results) != 2 || r.results[0].IsMainResult || r.results[0].Text != "[1] 1" {
		t.Fatalf("output and values: %+v", r)
	}
	df := r.results[1]
	if !df.IsMainResult || !strings.Contains(df.Text, "n   s") || !strings.Contains(df.HTML, "<td>&lt;b&gt;</td>") || !strings.Contains(df.HTML, "<th>s</th>") {
		t.Fatalf("data frame: %+v", df)
	}
	r = run(t, k, code("plot(1:10)\nhist(c(1, 2, 2, 3))\n'drawn'"))
	var pngs int
	for _, res := range r.results {
		if res.PNG != "" {
			b, err := base64.StdEncoding.DecodeString(res.PNG)
			if err != nil || !strings.HasPrefix(string(b), "\x89PNG\r\n") {
				t.Fatalf("plot is not a PNG: %v %q", err, res.PNG[:min(len(res.PNG), 20)])
			}
			pngs++
		}
	}
	if pngs != 2 || main(r) != `[1] "drawn"` {
		t.Fatalf("plots: %d PNGs, results %+v", pngs, r.results)
	}
	r = run(t, k, code("f <- function() stop('deep')\ng <- function() f()\ng()"))
	if r.done.Status != agentproto.StatusError || r.err == nil || r.err.Name != "simpleError" || r.err.Value != "deep" ||
		!strings.Contains(r.err.Traceback, "g()\nf()") || strings.Contains(r.err.Traceback, "exprs") {
		t.Fatalf("error: %+v", r.err)
	}
	if r = run(t, k, code("1 +")); r.err == nil || r.err.Name != "SyntaxError" {
		t.Fatalf("syntax error: %+v", r.err)
	}
	if r = run(t, k, code("warning('careful'); 3")); !strings.Contains(r.stderr, "careful") || main(r) != "[1] 3" {
		t.Fatalf("warning: %+v", r)
	}
	// E2B's env_vars/test_r.py: an execution's env, gone after it.
	r = run(t, k, agentproto.ExecuteSpec{Code: "Sys.getenv('FOO')", Env: map[string]string{"FOO": "bar", "E": ""}})
	if main(r) != `[1] "bar"` {
		t.Fatalf("env: %+v", r)
	}
	if r = run(t, k, code("Sys.getenv('FOO', unset = 'default')")); main(r) != `[1] "default"` {
		t.Fatalf("env leaked: %+v", r)
	}
	if r = run(t, k, code("x")); main(r) != "[1] 41" || r.done.Stats == nil || r.done.Stats.PeakMemoryBytes < 1<<20 {
		t.Fatalf("state lost, or stats: %+v %+v", r, r.done.Stats)
	}
}

// TestJava: jshell's state between executions, expression values as E2B
// shows them, exceptions and compile errors, the execution's env as
// system properties.
func TestJava(t *testing.T) {
	t.Parallel()
	k := start(t, "java", map[string]string{"TEST_ENV_VAR": "supertest"})
	if r := run(t, k, code("int x = 41;\nint twice(int n) { return 2 * n; }")); r.done.Status != agentproto.StatusOK || r.err != nil || len(r.results) != 0 {
		t.Fatalf("declarations: %+v %+v", r, r.err)
	}
	if r := run(t, k, code("x + 1")); main(r) != "42" {
		t.Fatalf("state: %+v %+v", r, r.err)
	}
	if r := run(t, k, code(`System.out.println("Hello, World!"); System.err.print("e");`)); r.stdout != "Hello, World!\n" || r.stderr != "e" {
		t.Fatalf("output: %+v", r)
	}
	if r := run(t, k, code(`String s = "a\"b"; s + "\n" + twice(x)`)); main(r) != "a\"b\n82" {
		t.Fatalf("string value: %q %+v", main(r), r.err)
	}
	r := run(t, k, code("void f() { throw new IllegalStateException(\"deep\"); }\nf();"))
	if r.done.Status != agentproto.StatusError || r.err == nil || r.err.Name != "IllegalStateException" || r.err.Value != "deep" ||
		!strings.Contains(r.err.Traceback, "java.lang.IllegalStateException: deep") || !strings.Contains(r.err.Traceback, "f(") {
		t.Fatalf("exception: %+v", r.err)
	}
	if r = run(t, k, code("int y = ")); r.err == nil || r.err.Name != "CompilationError" {
		t.Fatalf("compile error: %+v", r.err)
	}
	if r = run(t, k, code("nothing + 1")); r.err == nil || r.err.Name != "CompilationError" || !strings.Contains(r.err.Value, "cannot find symbol") {
		t.Fatalf("unknown symbol: %+v", r.err)
	}
	// E2B's env_vars/test_java.py: the sandbox's env and an execution's
	// are system properties; the execution's is gone after it.
	if r = run(t, k, agentproto.ExecuteSpec{Code: `System.getProperty("TEST_ENV_VAR")`, Env: map[string]string{"TEST_ENV_VAR": "overwrite"}}); main(r) != "overwrite" {
		t.Fatalf("env: %+v", r)
	}
	if r = run(t, k, code(`System.getProperty("TEST_ENV_VAR")`)); main(r) != "supertest" {
		t.Fatalf("sandbox env: %+v", r)
	}
	if r = run(t, k, code(`System.getProperty("FOO", "default")`)); main(r) != "default" {
		t.Fatalf("default: %+v", r)
	}
	if r = run(t, k, code("twice(x)")); main(r) != "82" || r.done.Stats == nil || r.done.Stats.PeakMemoryBytes < 1<<20 {
		t.Fatalf("state lost, or stats: %+v %+v", r, r.done.Stats)
	}
}

// TestRJavaStreamsAndLimits: output streams as written, a timeout
// interrupts the code and keeps the state, code that ignores the
// interrupt is killed after the grace and the next execution starts a
// fresh interpreter, the output cap holds, and a dead interpreter is
// replaced.
func TestRJavaStreamsAndLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lang, set, get, want, stream, loop, stubborn, flood, die string
	}{
		{"r", "y <- 7", "y", "[1] 7",
			"cat('first\\n'); Sys.sleep(30)",
			"while (TRUE) {}",
			"f <- file('/proc/self/fd/0'); repeat tryCatch(Sys.sleep(10), interrupt = function(e) NULL)",
			"repeat cat(strrep('x', 99), '\\n', sep = '')",
			"tools::pskill(Sys.getpid(), 9)"},
		{"java", "int y = 7;", "y", "7",
			"System.out.println(\"first\"); Thread.sleep(30000);",
			"while (true) {}",
			"while (true) { try { Thread.sleep(10000); } catch (Throwable e) {} }",
			"while (true) System.out.println(\"x\".repeat(99));",
			"Runtime.getRuntime().halt(9);"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			t.Parallel()
			k := start(t, tc.lang, nil)
			run(t, k, code(tc.set))
			// Streamed: the first line arrives while the code sleeps.
			first := make(chan time.Duration, 1)
			t0 := time.Now()
			done := k.Execute(t.Context(), agentproto.ExecuteSpec{Code: tc.stream, TimeoutMS: 3000}, func(ev agentproto.Event) error {
				if ev.Type == agentproto.EventStdout && strings.Contains(string(ev.Data), "first") {
					select {
					case first <- time.Since(t0):
					default:
					}
				}
				return nil
			})
			select {
			case d := <-first:
				if d > 2500*time.Millisecond {
					t.Fatalf("the first line came after %s, not as written", d)
				}
			default:
				t.Fatalf("no first line; done %+v", done)
			}
			if done.Status != agentproto.StatusTimeout {
				t.Fatalf("sleep past the timeout: %+v", done)
			}
			r := run(t, k, agentproto.ExecuteSpec{Code: tc.loop, TimeoutMS: 500})
			if r.done.Status != agentproto.StatusTimeout || r.err == nil || r.err.Name != "TimeoutError" || strings.Contains(r.err.Value, "killed") {
				t.Fatalf("timeout: %+v %+v", r.done, r.err)
			}
			if r = run(t, k, code(tc.get)); main(r) != tc.want {
				t.Fatalf("state lost after an interrupt: %+v %+v", r, r.err)
			}
			r = run(t, k, agentproto.ExecuteSpec{Code: tc.stubborn, TimeoutMS: 500})
			if r.done.Status != agentproto.StatusTimeout || r.err == nil || !strings.Contains(r.err.Value, "killed") {
				t.Fatalf("stubborn code: %+v %+v", r.done, r.err)
			}
			if r = run(t, k, code(tc.set)); r.done.Status != agentproto.StatusOK {
				t.Fatalf("no restart after the kill: %+v %+v", r.done, r.err)
			}
			r = run(t, k, agentproto.ExecuteSpec{Code: tc.flood, MaxOutputBytes: 10000, TimeoutMS: 10000, StopAtOutputCap: true})
			if r.done.Status != agentproto.StatusOutputLimit || !r.done.Truncated || len(r.stdout) != 10000 {
				t.Fatalf("output cap: status %s truncated %v len %d", r.done.Status, r.done.Truncated, len(r.stdout))
			}
			if r = run(t, k, code(tc.get)); main(r) != tc.want {
				t.Fatalf("state lost after the output cap: %+v %+v", r, r.err)
			}
			r = run(t, k, code(tc.die))
			if r.done.Status != agentproto.StatusKilled || r.err == nil || r.err.Name != "KernelDied" {
				t.Fatalf("death: %+v %+v", r.done, r.err)
			}
			if r = run(t, k, code(tc.set)); r.done.Status != agentproto.StatusOK {
				t.Fatalf("no restart after death: %+v %+v", r.done, r.err)
			}
		})
	}
}

// TestRJavaNoSubprocess: R and Java start under the no-subprocess filter
// (through the seccomp-exec helper, as Node does). Each way to start a
// program works unconfined (a control: the program leaves a file) and is
// refused under the filter, with an agent's subprocess_denied report and
// no file; ordinary code (the JVM's threads, jshell's compiler, R's
// plots) keeps working and the state is kept.
func TestRJavaNoSubprocess(t *testing.T) {
	t.Parallel()
	cases := []struct{ lang, name, code string }{
		{"r", "system", "system('touch MARK'); 'ran'"},
		{"r", "system2", "system2('touch', 'MARK'); 'ran'"},
		{"r", "pipe", "readLines(pipe('touch MARK; echo x')); 'ran'"},
		{"java", "ProcessBuilder", `new ProcessBuilder("touch", "MARK").start().waitFor()`},
		{"java", "Runtime.exec", `Runtime.getRuntime().exec(new String[]{"touch", "MARK"}).waitFor()`},
		{"java", "fork mechanism", `System.setProperty("jdk.lang.Process.launchMechanism", "FORK"); new ProcessBuilder("touch", "MARK").start().waitFor()`},
		{"java", "vfork mechanism", `System.setProperty("jdk.lang.Process.launchMechanism", "VFORK"); new ProcessBuilder("touch", "MARK").start().waitFor()`},
	}
	for _, c := range cases {
		t.Run(c.lang+"/"+c.name, func(t *testing.T) {
			t.Parallel()
			mark := filepath.Join(t.TempDir(), "ran")
			attack := strings.ReplaceAll(c.code, "MARK", mark)
			free := startWithHelper(t, c.lang)
			if r := run(t, free, code(attack)); r.err != nil || !waitFile(mark) {
				t.Fatalf("unconfined, it must start the program: %v %+v", r, r.err)
			}
			os.Remove(mark)
			k := startWithHelper(t, c.lang)
			r, vs := violations(t, k, withPolicy(attack, noSubprocess(t)))
			if _, err := os.Stat(mark); err == nil {
				t.Fatalf("confined, the program ran: %v", r)
			}
			if len(vs) == 0 || vs[0].Kind != "subprocess_denied" || vs[0].Source != agentproto.SourceAgent || !strings.Contains("clone fork vfork execve", vs[0].Target) {
				t.Fatalf("violations %+v (%v %+v)", vs, r, r.err)
			}
		})
	}
	for _, c := range []struct{ lang, set, get, want string }{
		{"r", "v <- 20; plot(1:3); Sys.sleep(0.01)", "v + 1", "[1] 21"},
		{"java", "int v = 20; var th = new Thread(() -> {}); th.start(); th.join();", "v + 1", "21"},
	} {
		t.Run(c.lang+"/ordinary code", func(t *testing.T) {
			t.Parallel()
			k := startWithHelper(t, c.lang)
			pol := noSubprocess(t)
			r, vs := violations(t, k, withPolicy(c.set, pol))
			if r.err != nil || len(vs) != 0 {
				t.Fatalf("%v %+v %+v", r, r.err, vs)
			}
			if r, vs = violations(t, k, withPolicy(c.get, pol)); main(r) != c.want || len(vs) != 0 || !k.p.filtered {
				t.Fatalf("state under the filter: %v %+v filtered %v", r, vs, k.p.filtered)
			}
		})
	}
}

// TestJavaMemoryEnv: the JVM sizes its heap from the sandbox's memory
// limit (MemoryEnv): half of it, not a quarter of the host's memory,
// which is what a sandbox shows it without.
func TestJavaMemoryEnv(t *testing.T) {
	t.Parallel()
	heap := "Runtime.getRuntime().maxMemory() >> 20"
	free := start(t, "java", nil)
	k := start(t, "java", map[string]string{MemoryEnv: fmt.Sprint(256 << 20)})
	var n, host int
	if _, err := fmt.Sscan(main(run(t, k, code(heap))), &n); err != nil || n > 130 || n < 100 {
		t.Fatalf("heap under a 256 MiB limit: %d MiB (%v)", n, err)
	}
	if _, err := fmt.Sscan(main(run(t, free, code(heap))), &host); err != nil || host <= 130 {
		t.Fatalf("heap without the limit: %d MiB (%v)", host, err)
	}
}

// TestInstalled: the agent offers R and Java only where the template has
// their interpreters, the other languages always.
func TestInstalled(t *testing.T) {
	t.Parallel()
	all := []string{"python", "javascript", "typescript", "bash", "r", "java"}
	none := func(string) error { return os.ErrNotExist }
	if got := installed(all, none); fmt.Sprint(got) != "[python javascript typescript bash]" {
		t.Fatalf("without R and Java: %v", got)
	}
	onlyR := func(p string) error {
		if strings.Contains(p, "/R/") {
			return nil
		}
		return os.ErrNotExist
	}
	if got := installed(all, onlyR); fmt.Sprint(got) != "[python javascript typescript bash r]" {
		t.Fatalf("with R only: %v", got)
	}
}

// TestRLinesWhole: R's print writes a line in three flushed pieces
// (`[1]`, the value, the newline); each line reaches the reader as one
// piece, as E2B's R kernel sends it (its test_r_kernel checks one stdout
// message), also when the interpreter computes for longer than lineHold
// between two pieces. A line the code leaves without its end while it
// waits (a sleep) waits lineHold: it arrives before the rest that the
// code writes later, and before the result that follows it. The control:
// the same code in bash, whose lines are not held, gives the pieces as
// written.
func TestRLinesWhole(t *testing.T) {
	t.Parallel()
	k := start(t, "r", nil)
	var events []string
	collect := func(c string) []string {
		events = nil
		k.Execute(t.Context(), code(c), func(ev agentproto.Event) error {
			switch ev.Type {
			case agentproto.EventStdout:
				events = append(events, "out:"+string(ev.Data))
			case agentproto.EventResult:
				events = append(events, "result:"+ev.Result.Text)
			}
			return nil
		})
		return events
	}
	got := collect(`for (i in 1:200) print("Hello, World!")`)
	if len(got) == 0 {
		t.Fatal("no output")
	}
	lines := 0
	for _, ev := range got {
		if !strings.HasSuffix(ev, "\n") {
			t.Fatalf("a piece of a line arrived alone: %q (of %d events)", ev, len(got))
		}
		lines += strings.Count(ev, "[1] \"Hello, World!\"\n")
	}
	if lines != 200 {
		t.Fatalf("%d whole lines, want 200", lines)
	}
	// Computing for 400 ms between the pieces (running, not waiting):
	// still one line.
	got = collect("cat('[1]'); t0 <- Sys.time(); while (as.numeric(Sys.time() - t0) < 0.4) NULL; cat(' busy\\n')")
	if want := []string{"out:[1] busy\n"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a line written around a computation: events %q, want %q", got, want)
	}
	// A prompt left without its end arrives on its own, before the end
	// written 300 ms later; a partial line comes before the value.
	got = collect(`cat("wait: "); Sys.sleep(0.3); cat("done\n"); cat("tail"); 7`)
	if want := []string{"out:wait: ", "out:done\n", "out:tail", "result:[1] 7"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %q, want %q", got, want)
	}

	// The control: bash's pieces are sent as written.
	b := start(t, "bash", nil)
	var pieces []string
	b.Execute(t.Context(), code(`for i in $(seq 50); do printf '[1]'; sleep 0.002; printf ' "x"'; sleep 0.002; printf '\n'; done`), func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventStdout {
			pieces = append(pieces, string(ev.Data))
		}
		return nil
	})
	split := false
	for _, p := range pieces {
		split = split || !strings.HasSuffix(p, "\n")
	}
	if !split {
		t.Fatalf("the control: bash's pieces arrived whole too (%d events): the test shows nothing", len(pieces))
	}
}
