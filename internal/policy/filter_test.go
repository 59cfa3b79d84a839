package policy_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/policy"
)

func ptr[T any](v T) *T { return &v }

var redactAll = &policy.OutputFiltering{StripSensitiveData: ptr(true)}

const (
	awsKey    = "AKIAIOSFODNN7EXAMPLE"
	openaiKey = "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789"
	ghToken   = "ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"
	ghPAT     = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
	slack     = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
	jwt       = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
	pemKey    = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgwMbRvI0MBZhpF\nc2VjcmV0a2V5bWF0ZXJpYWw=\n-----END RSA PRIVATE KEY-----"
	envSecret = "hunter2-correct-horse"
)

var env = map[string]string{"DB_PASSWORD": envSecret, "HOME": "/home/user", "API_TOKEN": "short", "LANG": "C.UTF-8"}

func TestRedactKinds(t *testing.T) {
	t.Parallel()
	f := policy.NewOutputFilter(redactAll, env)
	cases := []struct{ in, want string }{
		{"key=" + awsKey + "\n", "key=[REDACTED:aws_access_key]\n"},
		{"OPENAI_API_KEY=" + openaiKey, "OPENAI_API_KEY=[REDACTED:api_key]"},
		{"token " + ghToken + " and " + ghPAT, "token [REDACTED:github_token] and [REDACTED:github_token]"},
		{"slack: " + slack, "slack: [REDACTED:slack_token]"},
		{"Authorization: Bearer abc.DEF-123_xyz~+/=", "Authorization: Bearer [REDACTED:bearer_token]"},
		{"authorization: bearer " + jwt, "authorization: bearer [REDACTED:jwt]"},
		{"jwt=" + jwt + ";", "jwt=[REDACTED:jwt];"},
		{"before\n" + pemKey + "\nafter", "before\n[REDACTED:private_key]\nafter"},
		{"postgres://admin:s3cr3t!@db.internal:5432/app", "postgres://admin:[REDACTED:url_password]@db.internal:5432/app"},
		{"https://bob:pw@example.com/x", "https://bob:[REDACTED:url_password]@example.com/x"},
		{"mail alice.smith+tag@example.co.uk now", "mail [REDACTED:email] now"},
		{"pw is " + envSecret + "!", "pw is [REDACTED:secret_env]!"},
		{"b64 " + base64.StdEncoding.EncodeToString([]byte(envSecret)), "b64 [REDACTED:secret_env_base64]"},
		// Not secrets: short env values, non-secret names, lookalikes.
		{"short C.UTF-8 /home/user sk-short AKIA123", "short C.UTF-8 /home/user sk-short AKIA123"},
		{"a@b is no address; user@host neither", "a@b is no address; user@host neither"},
		{"plain text 1 + 1 = 2\n", "plain text 1 + 1 = 2\n"},
	}
	for _, c := range cases {
		if got := f.Redact(c.in); got != c.want {
			t.Errorf("Redact(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

func TestRedactBase64AtAnyAlignment(t *testing.T) {
	t.Parallel()
	f := policy.NewOutputFilter(redactAll, env)
	for _, prefix := range []string{"", "x", "xy", "user=", "password: "} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
			encoded := enc.EncodeToString([]byte(prefix + envSecret + "\n"))
			got := f.Redact("data: " + encoded)
			if !strings.Contains(got, "[REDACTED:secret_env_base64]") {
				t.Errorf("base64 of %q+secret not redacted: %q", prefix, got)
			}
			// What is left cannot be decoded back to the secret.
			if strings.Contains(got, encoded[len(encoded)/2:]) && len(encoded) > 40 {
				t.Errorf("most of the encoding survived: %q", got)
			}
		}
	}
}

// A secret split across writes, at every split point, is redacted as
// if written at once; with no secret, the text passes unchanged.
func TestRedactorSplitWrites(t *testing.T) {
	t.Parallel()
	f := policy.NewOutputFilter(redactAll, env)
	texts := []string{
		"token: " + ghToken + "\nnext line\n",
		"export KEY=" + openaiKey + " done\n",
		"Authorization: Bearer abcdefgh12345678\n",
		"x " + pemKey + "\ny\n",
		"db=" + envSecret + "\n",
		"mail me: a.b@example.org\n",
		"no secret here at all, just text\nand lines\n",
		"jwt " + jwt,
	}
	for _, text := range texts {
		want := f.Redact(text)
		for i := 0; i <= len(text); i++ {
			for j := i; j <= len(text); j += 7 {
				r := f.NewRedactor()
				var out []byte
				out = append(out, r.Write([]byte(text[:i]))...)
				out = append(out, r.Write([]byte(text[i:j]))...)
				out = append(out, r.Write([]byte(text[j:]))...)
				out = append(out, r.Flush()...)
				if string(out) != want {
					t.Fatalf("split at %d,%d of %q:\n got %q\nwant %q", i, j, text, out, want)
				}
			}
		}
	}
}

// TestRedactorSecretAcrossLines: a secret env value printed across lines
// (print(key[:10]); print(key[10:])), a character a line, with CRLF, or a
// value with line breaks of its own printed with other ones, is redacted
// whole, in one write or split across writes anywhere. The control: the
// text with its line breaks removed holds the secret, and the exact
// matching alone (a filter without the split search, here the value's
// halves are no secret) lets each half through.
func TestRedactorSecretAcrossLines(t *testing.T) {
	t.Parallel()
	multi := "line-one-secret\nline-two-secret"
	f := policy.NewOutputFilter(redactAll, env, map[string]string{"PEM_KEY": multi})
	k := envSecret
	every := ""
	for i := range k {
		every += k[i:i+1] + "\n"
	}
	for _, text := range []string{
		k[:10] + "\n" + k[10:] + "\n",
		"key: " + k[:3] + "\n" + k[3:] + " and more\n",
		k[:5] + "\r\n" + k[5:] + "\r\n",
		every,
		"x " + k[:7] + "\n\n\n" + k[7:] + "\n",
		"begin\n" + strings.ReplaceAll(multi, "\n", "\r\n") + "\nend\n",
		strings.ReplaceAll(multi, "\n", "") + "\n",
	} {
		secret := k
		if strings.HasPrefix(text, "begin") || strings.HasPrefix(text, "line-one") {
			secret = strings.ReplaceAll(multi, "\n", "")
		}
		flat := func(s string) string { return strings.NewReplacer("\n", "", "\r", "").Replace(s) }
		if !strings.Contains(flat(text), secret) {
			t.Fatalf("control: %q does not hold the secret", text)
		}
		for i := 0; i <= len(text); i++ {
			for j := i; j <= len(text); j++ {
				r := f.NewRedactor()
				out := string(r.Write([]byte(text[:i]))) + string(r.Write([]byte(text[i:j]))) +
					string(r.Write([]byte(text[j:]))) + string(r.Flush())
				if strings.Contains(flat(out), secret[:len(secret)/2+1]) || !strings.Contains(out, "[REDACTED:secret_env]") {
					t.Fatalf("split at %d,%d of %q: %q", i, j, text, out)
				}
			}
		}
	}
	// A line that ends like the start of a secret is held only until
	// the next line shows it is not one; nothing is changed or lost.
	r := f.NewRedactor()
	if got := string(r.Write([]byte("a loop hu\n"))); got != "a loop " {
		t.Fatalf("released %q before the next line", got)
	}
	if got := string(r.Write([]byte("nting\n"))) + string(r.Flush()); got != "hu\nnting\n" {
		t.Fatalf("released %q after it", got)
	}
	if out := f.Redact("nothing here\nhunter\n3\n"); out != "nothing here\nhunter\n3\n" {
		t.Fatalf("a near miss changed: %q", out)
	}
}

// Complete lines leave at once; an unfinished one waits for its end.
func TestRedactorReleasesLines(t *testing.T) {
	t.Parallel()
	r := policy.NewOutputFilter(redactAll, env).NewRedactor()
	if got := string(r.Write([]byte("hello\nwor"))); got != "hello\n" {
		t.Fatalf("released %q", got)
	}
	if got := string(r.Write([]byte("ld\n"))); got != "world\n" {
		t.Fatalf("released %q", got)
	}
	if got := string(r.Write([]byte("tail"))) + string(r.Flush()); got != "tail" {
		t.Fatalf("flushed %q", got)
	}
}

// A flood (megabytes, no line ends) is released with a bounded hold-back;
// a secret in it is still found.
func TestRedactorFlood(t *testing.T) {
	t.Parallel()
	r := policy.NewOutputFilter(redactAll, env).NewRedactor()
	chunk := []byte(strings.Repeat("A", 64<<10))
	released := 0
	for i := 0; i < 32; i++ {
		released += len(r.Write(chunk))
	}
	if held := 32*len(chunk) - released; held > policy.MaxHold {
		t.Fatalf("held back %d bytes of a flood, more than %d", held, policy.MaxHold)
	}
	// Words with a secret among them, no line end, split mid-secret.
	flood := strings.Repeat("word ", 4000) + ghToken + " " + strings.Repeat("word ", 4000)
	var out []byte
	for i := 0; i < len(flood); i += 1000 {
		out = append(out, r.Write([]byte(flood[i:min(i+1000, len(flood))]))...)
	}
	out = append(out, r.Flush()...)
	if strings.Contains(string(out), ghToken[4:20]) || !strings.Contains(string(out), "[REDACTED:github_token]") {
		t.Fatal("a token in a flood of words leaked")
	}
}

// A PEM key streamed line by line is dropped as it comes: nothing of its
// body is released, even before its END arrives.
func TestRedactorPEMStream(t *testing.T) {
	t.Parallel()
	r := policy.NewOutputFilter(redactAll, env).NewRedactor()
	var out []byte
	for _, line := range strings.SplitAfter("start\n"+pemKey+"\nend\n", "\n") {
		out = append(out, r.Write([]byte(line))...)
		if strings.Contains(string(out), "MIIE") {
			t.Fatalf("key material released: %q", out)
		}
	}
	out = append(out, r.Flush()...)
	if string(out) != "start\n[REDACTED:private_key]\nend\n" {
		t.Fatalf("got %q", out)
	}
	// An unterminated key never comes out either.
	r = policy.NewOutputFilter(redactAll, env).NewRedactor()
	out = r.Write([]byte("-----BEGIN PRIVATE KEY-----\nMIIEsecret\nmore"))
	out = append(out, r.Write([]byte("secret\n"))...)
	out = append(out, r.Flush()...)
	if string(out) != "[REDACTED:private_key]" {
		t.Fatalf("unterminated key: %q", out)
	}
}

func TestNoFilter(t *testing.T) {
	t.Parallel()
	if f := policy.NewOutputFilter(nil, env); f != nil {
		t.Fatal("nil OutputFiltering made a filter")
	}
	if f := policy.NewOutputFilter(&policy.OutputFiltering{StripSensitiveData: ptr(false)}, env); f != nil {
		t.Fatal("all-off OutputFiltering made a filter")
	}
	var f *policy.OutputFilter
	if f.Text(awsKey) != awsKey || f.Redact(awsKey) != awsKey || f.MaxOutputLength() != 0 {
		t.Fatal("a nil filter changed text")
	}
}

func TestSecretEnv(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, value string
		want        bool
	}{
		{"OPENAI_API_KEY", "sk-12345678", true}, {"db_password", "longenough", true}, {"GITHUB_TOKEN", "abcdefgh", true},
		{"AWS_SECRET_ACCESS_KEY", "x/y/z/abcd", true}, {"SESSION_COOKIE", "abcdefghij", true},
		{"API_TOKEN", "short", false}, {"HOME", "/home/user/project", false}, {"PATH", "/usr/bin:/bin", false},
		{"PWD", "/home/user/work", false}, {"LANG", "en_US.UTF-8", false},
	} {
		if got := policy.SecretEnv(c.name, c.value); got != c.want {
			t.Errorf("SecretEnv(%s, %q) = %v", c.name, c.value, got)
		}
	}
}

func TestCap(t *testing.T) {
	t.Parallel()
	c := policy.Cap{Limit: 10}
	var out []byte
	for _, p := range []string{"12345", "678", "9abcdef", "ghi"} {
		out = append(out, c.Take([]byte(p))...)
	}
	if string(out) != "123456789a" || c.Dropped != 8 || !strings.Contains(c.Marker(), "8 more bytes dropped") {
		t.Fatalf("out %q, dropped %d, marker %q", out, c.Dropped, c.Marker())
	}
	// Never half a UTF-8 sequence.
	c = policy.Cap{Limit: 4}
	if got := string(c.Take([]byte("abcé"))); got != "abc" || c.Dropped != 2 {
		t.Fatalf("utf-8 cut %q, dropped %d", got, c.Dropped)
	}
	if s, d := policy.CutText("hello world", 5); d != 6 || !strings.HasPrefix(s, "hello\n[truncated: 6 more bytes") {
		t.Fatalf("CutText = %q, %d", s, d)
	}
	if s, d := policy.CutText("short", 5); s != "short" || d != 0 {
		t.Fatalf("CutText of a fitting text = %q, %d", s, d)
	}
}

func TestSanitizeTraceback(t *testing.T) {
	t.Parallel()
	py := `Traceback (most recent call last):
  File "<string>", line 212, in _run
    exec(compile(tree, name, "exec"), _globals)
  File "<cell-3>", line 2, in <module>
    json.loads(data)
  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
  File "/usr/lib/python3/dist-packages/pandas/core/frame.py", line 10, in f
    raise ValueError("x")
ValueError: bad data in /var/lib/sheepfold/templates/python/rootfs/etc/x
`
	want := `Traceback (most recent call last):
  File "<cell-3>", line 2, in <module>
    json.loads(data)
  File "<stdlib>/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
  File "<lib>/pandas/core/frame.py", line 10, in f
    raise ValueError("x")
ValueError: bad data in <host>
`
	if got := policy.SanitizeTraceback(py); got != want {
		t.Errorf("python:\n%s\nwant:\n%s", got, want)
	}
	js := `ReferenceError: x is not defined
    at <cell>:1:1
    at Script.runInContext (node:vm:149:12)
    at run ([eval]:80:35)
    at Object.<anonymous> (/usr/lib/node_modules/lodash/lodash.js:10:3)
    at node:internal/main/eval_string:51:3`
	wantJS := `ReferenceError: x is not defined
    at <cell>:1:1
    at Object.<anonymous> (<lib>/lodash/lodash.js:10:3)
`
	if got := policy.SanitizeTraceback(js); got != wantJS {
		t.Errorf("node:\n%q\nwant:\n%q", got, wantJS)
	}
}

// FuzzRedactorSplit: wherever a stream is split, a planted secret never
// comes out, and output without secrets passes unchanged.
func FuzzRedactorSplit(f *testing.F) {
	f.Add("before ", " after\n", uint(3), uint(9))
	f.Add("", "", uint(0), uint(0))
	f.Add("x\n-----BEGIN", "\n", uint(1), uint(50))
	flt := policy.NewOutputFilter(redactAll, env)
	secrets := []string{ghToken, awsKey, envSecret, base64.StdEncoding.EncodeToString([]byte(envSecret)), pemKey}
	f.Fuzz(func(t *testing.T, pre, post string, i, j uint) {
		for _, secret := range secrets {
			text := pre + " " + secret + " " + post
			a, b := int(i%uint(len(text)+1)), int(j%uint(len(text)+1))
			if a > b {
				a, b = b, a
			}
			r := flt.NewRedactor()
			out := string(r.Write([]byte(text[:a]))) + string(r.Write([]byte(text[a:b]))) + string(r.Write([]byte(text[b:]))) + string(r.Flush())
			if strings.Contains(out, secret) {
				t.Fatalf("secret %q survived in %q", secret, out)
			}
		}
		// The env secret printed across two lines, split where i says.
		cut := 1 + int(i%uint(len(envSecret)-1))
		text := pre + envSecret[:cut] + "\n" + envSecret[cut:] + post
		a := int(j % uint(len(text)+1))
		r := flt.NewRedactor()
		out := string(r.Write([]byte(text[:a]))) + string(r.Write([]byte(text[a:]))) + string(r.Flush())
		if strings.Contains(strings.ReplaceAll(out, "\n", ""), envSecret) && !strings.Contains(pre+post, envSecret[:cut]) {
			t.Fatalf("the secret across lines survived in %q", out)
		}
		plain := strings.Map(func(r rune) rune {
			if r == '@' || r == '-' || r == '_' || r == '.' {
				return ' '
			}
			return r
		}, pre+post)
		if policy.NewOutputFilter(redactAll).Redact(plain) != plain && !strings.Contains(strings.ToLower(plain), "bearer") &&
			!strings.Contains(plain, "AKIA") && !strings.Contains(plain, "ASIA") {
			t.Fatalf("text without secrets changed: %q", plain)
		}
	})
}

// The cost on the warm 1+1 path: one result text and no output.
func BenchmarkFilterSmall(b *testing.B) {
	f := policy.NewOutputFilter(&policy.OutputFiltering{StripSensitiveData: ptr(true), SanitizeErrors: ptr(true),
		MaxOutputLength: ptr(int64(10000))}, env)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := f.NewRedactor()
		r.Write([]byte("hello world\n"))
		r.Flush()
		_ = f.Text("2")
	}
}

func BenchmarkRedactorFlood(b *testing.B) {
	f := policy.NewOutputFilter(redactAll, env)
	chunk := []byte(strings.Repeat("some output line number 12345\n", 2000))
	b.SetBytes(int64(len(chunk)))
	r := f.NewRedactor()
	for i := 0; i < b.N; i++ {
		r.Write(chunk)
	}
}
