package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb/filesystempbconnect"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb/processpbconnect"
	"github.com/sheepfold/sheepfold/internal/server"
)

// e2bSandbox is a sandbox created through the E2B control plane.
type e2bSandbox struct {
	ID, Token, Traffic string
}

// e2bDo sends an E2B control-plane request with X-API-Key.
func (e *env) e2bDo(method, path, key string, body any) resp {
	e.t.Helper()
	return e.do(method, path, "", body, "X-API-Key", key)
}

func (e *env) e2bCreate(key string, body map[string]any) e2bSandbox {
	e.t.Helper()
	r := e.e2bDo("POST", "/v2/sandboxes", key, body)
	want(e.t, r, http.StatusCreated, "")
	m := r.json(e.t)
	sb := e2bSandbox{ID: m["sandboxID"].(string), Token: m["envdAccessToken"].(string), Traffic: m["trafficAccessToken"].(string)}
	if sb.ID == "" || sb.Token == "" || sb.Traffic == "" || sb.Traffic == sb.Token || m["envdVersion"] != "0.6.4" || m["clientID"] == "" {
		e.t.Fatalf("create answered %s", r.body)
	}
	return sb
}

// envd sends a data-plane request to port 49983 of a sandbox.
func (e *env) envd(sb e2bSandbox, method, path string, body any, hdr ...string) resp {
	e.t.Helper()
	h := append([]string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49983", "X-Access-Token", sb.Token}, hdr...)
	return e.do(method, path, "", body, h...)
}

// e2bCode returns the numeric code of an E2B error body.
func e2bCode(t *testing.T, r resp) float64 {
	t.Helper()
	c, ok := r.json(t)["code"].(float64)
	if !ok {
		t.Fatalf("no numeric code in %s", r.body)
	}
	return c
}

// headerTransport adds the E2B routing headers to every request.
type headerTransport struct{ hdr http.Header }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header[k] = v
	}
	return http.DefaultTransport.RoundTrip(r)
}

// rpcClients are Connect clients (JSON, as the E2B SDKs use) for a sandbox.
func (e *env) rpcClients(sb e2bSandbox, user string) (processpbconnect.ProcessClient, filesystempbconnect.FilesystemClient) {
	hdr := http.Header{"E2b-Sandbox-Id": {sb.ID}, "E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {sb.Token}}
	if user != "" {
		hdr.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	hc := &http.Client{Transport: headerTransport{hdr}}
	return processpbconnect.NewProcessClient(hc, e.url, connect.WithProtoJSON()),
		filesystempbconnect.NewFilesystemClient(hc, e.url, connect.WithProtoJSON())
}

func TestE2BControlPlane(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})

	r := e.e2bDo("POST", "/v2/sandboxes", "e2b_"+strings.Repeat("0", 40), map[string]any{"templateID": "base"})
	if r.status != http.StatusUnauthorized || e2bCode(t, r) != 401 {
		t.Fatalf("bad key: %d %s", r.status, r.body)
	}
	r = e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "no-such-template"})
	if r.status < 400 || e2bCode(t, r) != float64(r.status) {
		t.Fatalf("unknown template: %d %s", r.status, r.body)
	}
	for _, body := range []map[string]any{
		{"templateID": "base", "allow_internet_access": true, "network": map[string]any{"denyOut": []string{"1.1.1.1"}}},
		{"templateID": "base", "network": map[string]any{"allowOut": []string{"bad host"}}},
	} {
		if r = e.e2bDo("POST", "/v2/sandboxes", e.keyA, body); r.status != http.StatusBadRequest {
			t.Fatalf("network %v: %d %s", body["network"], r.status, r.body)
		}
	}

	a := e.e2bCreate(e.keyA, map[string]any{"templateID": "code-interpreter-v1", "timeout": 60,
		"metadata": map[string]string{"k": "v", "a b": "c=d"}, "envVars": map[string]string{"FOO": "bar"}, "someFutureField": 1})
	// b's create begins once a's has answered, so its start time (kept
	// to the microsecond) is later: the listing's order is known.
	b := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "metadata": map[string]string{"k": "w"}})
	other := e.e2bCreate(e.keyB, map[string]any{"templateID": "base"})

	// getInfo, and owners do not see each other's sandboxes.
	r = e.e2bDo("GET", "/sandboxes/"+a.ID, e.keyA, nil)
	want(t, r, http.StatusOK, "")
	info := r.json(t)
	if info["sandboxID"] != a.ID || info["templateID"] != "code-interpreter-v1" || info["state"] != "running" ||
		info["envdAccessToken"] != a.Token || info["metadata"].(map[string]any)["a b"] != "c=d" {
		t.Fatalf("info: %s", r.body)
	}
	end, _ := time.Parse(time.RFC3339, info["endAt"].(string))
	if d := time.Until(end); d < 50*time.Second || d > 61*time.Second {
		t.Fatalf("endAt %v is not 60 s away", end)
	}
	if r = e.e2bDo("GET", "/sandboxes/"+other.ID, e.keyA, nil); r.status != 404 || e2bCode(t, r) != 404 {
		t.Fatalf("another owner's sandbox: %d %s", r.status, r.body)
	}

	// list: newest first, metadata filter encoded as the SDK does, paging.
	list := func(query string) ([]string, string) {
		r := e.e2bDo("GET", "/v2/sandboxes"+query, e.keyA, nil)
		want(t, r, http.StatusOK, "")
		var items []map[string]any
		if err := json.Unmarshal(r.body, &items); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, it := range items {
			ids = append(ids, it["sandboxID"].(string))
		}
		return ids, r.header.Get("X-Next-Token")
	}
	if ids, next := list(""); strings.Join(ids, ",") != b.ID+","+a.ID || next != "" {
		t.Fatalf("list = %v next %q", ids, next)
	}
	// {k: v, "a b": "c=d"} as e2b@2.51.0 sends it.
	if ids, _ := list("?metadata=k%3Dv%26a%252520b%3Dc%25253Dd"); strings.Join(ids, ",") != a.ID {
		t.Fatalf("metadata filter = %v", ids)
	}
	ids, next := list("?limit=1")
	if len(ids) != 1 || ids[0] != b.ID || next == "" {
		t.Fatalf("page 1 = %v next %q", ids, next)
	}
	if ids, next = list("?limit=1&nextToken=" + url.QueryEscape(next)); len(ids) != 1 || ids[0] != a.ID {
		t.Fatalf("page 2 = %v next %q", ids, next)
	}
	if ids, _ = list("?state=paused"); len(ids) != 0 {
		t.Fatalf("paused = %v", ids)
	}
	if r = e.e2bDo("GET", "/v2/sandboxes?nextToken=garbage", e.keyA, nil); r.status != 400 {
		t.Fatalf("bad token: %d", r.status)
	}

	// setTimeout shortens and extends; connect only extends.
	want(t, e.e2bDo("POST", "/sandboxes/"+a.ID+"/timeout", e.keyA, map[string]any{"timeout": 600}), http.StatusNoContent, "")
	endOf := func(id string) time.Duration {
		t.Helper()
		r := e.e2bDo("GET", "/sandboxes/"+id, e.keyA, nil)
		want(t, r, http.StatusOK, "")
		end, _ := time.Parse(time.RFC3339, r.json(t)["endAt"].(string))
		return time.Until(end)
	}
	if d := endOf(a.ID); d < 590*time.Second {
		t.Fatalf("after setTimeout(600) the end is %v away", d)
	}
	r = e.e2bDo("POST", "/v2/sandboxes/"+a.ID+"/connect", e.keyA, map[string]any{"timeout": 30})
	want(t, r, http.StatusOK, "")
	if r.json(t)["envdAccessToken"] != a.Token {
		t.Fatalf("connect: %s", r.body)
	}
	if d := endOf(a.ID); d < 590*time.Second {
		t.Fatalf("connect shortened the lifetime to %v", d)
	}

	// kill, then everything about it is not found.
	want(t, e.e2bDo("DELETE", "/sandboxes/"+b.ID, e.keyA, nil), http.StatusNoContent, "")
	for _, rr := range []resp{
		e.e2bDo("DELETE", "/sandboxes/"+b.ID, e.keyA, nil),
		e.e2bDo("GET", "/sandboxes/"+b.ID, e.keyA, nil),
		e.e2bDo("POST", "/sandboxes/"+b.ID+"/timeout", e.keyA, map[string]any{"timeout": 10}),
		e.e2bDo("POST", "/v2/sandboxes/"+b.ID+"/connect", e.keyA, map[string]any{}),
	} {
		if rr.status != 404 || e2bCode(t, rr) != 404 {
			t.Fatalf("killed sandbox: %d %s", rr.status, rr.body)
		}
	}
	r = e.envd(b, "GET", "/health", nil)
	if r.status != http.StatusBadGateway || r.json(t)["sandboxId"] != b.ID || e2bCode(t, r) != 502 {
		t.Fatalf("health of a killed sandbox: %d %s", r.status, r.body)
	}
	if r = e.envd(a, "GET", "/health", nil); r.status != http.StatusNoContent {
		t.Fatalf("health: %d %s", r.status, r.body)
	}
}

func TestE2BEnvdProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "envVars": map[string]string{"FOO": "sandbox-wide"}})
	proc, _ := e.rpcClients(sb, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A wrong access token is refused before any RPC.
	bad := sb
	bad.Token = strings.Repeat("0", 64)
	badProc, _ := e.rpcClients(bad, "")
	if _, err := badProc.List(ctx, connect.NewRequest(&processpb.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong token: %v", err)
	}

	run := func(cmd string, envs map[string]string) (stdout, stderr string, end *processpb.ProcessEvent_EndEvent) {
		t.Helper()
		stream, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{
			Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}, Envs: envs}}))
		if err != nil {
			t.Fatal(err)
		}
		first := true
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if first && ev.GetStart() == nil {
				t.Fatalf("first event is %v, want start", ev)
			}
			first = false
			if d := ev.GetData(); d != nil {
				stdout += string(d.GetStdout())
				stderr += string(d.GetStderr())
			}
			if ev.GetEnd() != nil {
				end = ev.GetEnd()
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if end == nil {
			t.Fatal("no end event")
		}
		return stdout, stderr, end
	}
	out, errOut, end := run("echo $FOO $BAR; echo oops >&2; exit 3", map[string]string{"BAR": "per-call"})
	if out != "sandbox-wide per-call\n" || errOut != "oops\n" || end.ExitCode != 3 || !end.Exited || end.GetError() != "exit status 3" {
		t.Fatalf("run: %q %q %+v", out, errOut, end)
	}
	if out, _, end = run("echo ${BAR:-unset}", nil); out != "unset\n" || end.ExitCode != 0 || end.Error != nil {
		t.Fatalf("per-call env leaked: %q %+v", out, end)
	}

	// A background process with stdin: listed, fed, closed.
	stream, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/cat"}, Tag: ptr("catter")}))
	if err != nil || !stream.Receive() {
		t.Fatalf("start cat: %v %v", err, stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	list, err := proc.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil || len(list.Msg.Processes) != 1 || list.Msg.Processes[0].Pid != pid || list.Msg.Processes[0].GetTag() != "catter" {
		t.Fatalf("list: %v %v", list, err)
	}
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: "catter"}}
	if _, err := proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel,
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("meow\n")}}})); err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || string(stream.Msg().GetEvent().GetData().GetStdout()) != "meow\n" {
		t.Fatalf("echoed input: %v %v", stream.Msg(), stream.Err())
	}
	pidSel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	if _, err := proc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: pidSel})); err != nil {
		t.Fatal(err)
	}
	var endEv *processpb.ProcessEvent_EndEvent
	for stream.Receive() {
		if x := stream.Msg().GetEvent().GetEnd(); x != nil {
			endEv = x
		}
	}
	if endEv == nil || endEv.ExitCode != 0 {
		t.Fatalf("cat after closeStdin: %+v %v", endEv, stream.Err())
	}

	// Connect to a running process, then kill it.
	stream, err = proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"60"}}, Stdin: ptr(false)}))
	if err != nil || !stream.Receive() {
		t.Fatal(err)
	}
	pid = stream.Msg().GetEvent().GetStart().GetPid()
	stream.Close() // detach: the process lives on
	conn, err := proc.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{
		Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil || !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: %v %v", err, conn.Err())
	}
	if _, err := proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{
		Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	endEv = nil
	starts := 1
	for conn.Receive() {
		if x := conn.Msg().GetEvent().GetEnd(); x != nil {
			endEv = x
		}
		if conn.Msg().GetEvent().GetStart() != nil {
			starts++
		}
	}
	if endEv == nil || endEv.Exited || endEv.ExitCode != -1 || !strings.Contains(endEv.Status, "killed") {
		t.Fatalf("killed process end: %+v", endEv)
	}
	if starts != 1 {
		t.Fatalf("the connect stream had %d start events, want 1", starts)
	}

	// Unknown pids and a missing cwd are the Connect codes the SDK expects.
	_, err = proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{
		Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: 999999}}, Signal: processpb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal unknown pid: %v", err)
	}
	stream, err = proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/true", Cwd: ptr("/no/such/dir")}}))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("missing cwd: %v", err)
	}
	// Unknown users are refused.
	nobody, _ := e.rpcClients(sb, "mallory")
	if _, err := nobody.List(ctx, connect.NewRequest(&processpb.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("unknown user: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestE2BEnvdFilesystem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
	_, fsc := e.rpcClients(sb, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := fsc.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: "nope"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	mk, err := fsc.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: "d/sub"}))
	if err != nil || mk.Msg.Entry.Type != filesystempb.FileType_FILE_TYPE_DIRECTORY || mk.Msg.Entry.Path != "/home/user/d/sub" ||
		mk.Msg.Entry.Permissions != "drwxr-xr-x" || mk.Msg.Entry.Mode != 0o755 {
		t.Fatalf("makeDir: %v %v", mk, err)
	}
	if _, err := fsc.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: "d/sub"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("makeDir twice: %v", err)
	}

	// Upload: multipart with paths as filenames, then octet-stream gzip.
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	for _, f := range [][2]string{{"d/a.txt", "alpha"}, {"/tmp/b.txt", "beta"}} {
		pw, _ := mw.CreateFormFile("file", f[0])
		pw.Write([]byte(f[1]))
	}
	mw.Close()
	r := e.envd(sb, "POST", "/files", form.Bytes(), "Content-Type", mw.FormDataContentType())
	want(t, r, http.StatusOK, "")
	var entries []map[string]any
	json.Unmarshal(r.body, &entries)
	if len(entries) != 2 || entries[0]["path"] != "/home/user/d/a.txt" || entries[1]["path"] != "/tmp/b.txt" || entries[0]["type"] != "file" {
		t.Fatalf("upload: %s", r.body)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("gamma"))
	zw.Close()
	r = e.envd(sb, "POST", "/files?path=d/sub/g.txt", gz.Bytes(), "Content-Type", "application/octet-stream", "Content-Encoding", "gzip")
	want(t, r, http.StatusOK, "")
	if r = e.envd(sb, "GET", "/files?path=d/sub/g.txt", nil); r.status != 200 || string(r.body) != "gamma" {
		t.Fatalf("download: %d %q", r.status, r.body)
	}
	if r = e.envd(sb, "GET", "/files?path=d/none.txt", nil); r.status != 404 || e2bCode(t, r) != 404 {
		t.Fatalf("download missing: %d %s", r.status, r.body)
	}
	if r = e.envd(sb, "GET", "/files?path=d", nil); r.status != 400 {
		t.Fatalf("download a directory: %d %s", r.status, r.body)
	}

	// ListDir depth 1 and 2, in path order.
	ls := func(depth uint32) []string {
		res, err := fsc.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: "d", Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range res.Msg.Entries {
			out = append(out, en.Path)
		}
		return out
	}
	if got := strings.Join(ls(1), ","); got != "/home/user/d/a.txt,/home/user/d/sub" {
		t.Fatalf("depth 1: %s", got)
	}
	if got := strings.Join(ls(2), ","); got != "/home/user/d/a.txt,/home/user/d/sub,/home/user/d/sub/g.txt" {
		t.Fatalf("depth 2: %s", got)
	}
	mv, err := fsc.Move(ctx, connect.NewRequest(&filesystempb.MoveRequest{Source: "d/a.txt", Destination: "d/sub/a2.txt"}))
	if err != nil || mv.Msg.Entry.Path != "/home/user/d/sub/a2.txt" || mv.Msg.Entry.Permissions != "-rw-r--r--" {
		t.Fatalf("move: %v %v", mv, err)
	}
	if _, err := fsc.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: "d"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fsc.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: "d"})); err != nil {
		t.Fatalf("removing a missing path: %v", err)
	}

	// Metadata travels as X-Metadata-* headers and comes back on stat.
	r = e.envd(sb, "POST", "/files?path=meta.txt", "m", "Content-Type", "application/octet-stream", "X-Metadata-Owner-Team", "data")
	want(t, r, http.StatusOK, "")
	if !strings.Contains(string(r.body), `"metadata":{"owner-team":"data"}`) {
		t.Fatalf("upload with metadata: %s", r.body)
	}
	st, err := fsc.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: "meta.txt"}))
	if err != nil || st.Msg.Entry.Metadata["owner-team"] != "data" {
		t.Fatalf("stat metadata: %v %v", st, err)
	}

	// WatchDir: start first, then the changes, names relative to the directory.
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	watch, err := fsc.WatchDir(wctx, connect.NewRequest(&filesystempb.WatchDirRequest{Path: "w", Recursive: true}))
	if err == nil {
		watch.Receive()
		err = watch.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("watch a missing dir: %v", err)
	}
	if _, err := fsc.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: "w/sub"})); err != nil {
		t.Fatal(err)
	}
	watch, err = fsc.WatchDir(wctx, connect.NewRequest(&filesystempb.WatchDirRequest{Path: "w", Recursive: true, IncludeEntry: true}))
	if err != nil || !watch.Receive() || watch.Msg().GetStart() == nil {
		t.Fatalf("watch start: %v %v", err, watch.Err())
	}
	poll, err := fsc.CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	want(t, e.envd(sb, "POST", "/files?path=w/sub/new.txt", "x", "Content-Type", "application/octet-stream"), http.StatusOK, "")
	want(t, e.envd(sb, "POST", "/files?path=w/top.txt", "y", "Content-Type", "application/octet-stream"), http.StatusOK, "")
	var seen []string
	for len(seen) < 2 && watch.Receive() {
		fe := watch.Msg().GetFilesystem()
		if fe != nil && fe.Type == filesystempb.EventType_EVENT_TYPE_CREATE {
			if fe.Entry == nil || fe.Entry.Path != "/home/user/w/"+fe.Name {
				t.Fatalf("event without its entry: %v", fe)
			}
			seen = append(seen, fe.Name)
		}
	}
	if strings.Join(seen, ",") != "sub/new.txt,top.txt" {
		t.Fatalf("watch events: %v (%v)", seen, watch.Err())
	}
	watch.Close()
	deadline := time.Now().Add(5 * time.Second)
	var polled []string
	for time.Now().Before(deadline) && len(polled) == 0 {
		ev, err := fsc.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: poll.Msg.WatcherId}))
		if err != nil {
			t.Fatal(err)
		}
		for _, fe := range ev.Msg.Events {
			polled = append(polled, fe.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !slices.Contains(polled, "top.txt") || slices.Contains(polled, "sub/new.txt") {
		t.Fatalf("polled (not recursive) events: %v", polled)
	}
	if _, err := fsc.RemoveWatcher(ctx, connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: poll.Msg.WatcherId})); err != nil {
		t.Fatal(err)
	}
	if _, err := fsc.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: poll.Msg.WatcherId})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}

	// Signed URLs: no sandbox headers, the signature finds the sandbox.
	sig := func(path, op, exp string) string {
		raw := path + ":" + op + "::" + sb.Token
		if exp != "" {
			raw += ":" + exp
		}
		sum := sha256.Sum256([]byte(raw))
		return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	}
	r = e.do("POST", "/files?path=signed.txt&signature="+url.QueryEscape(sig("signed.txt", "write", "")), "", "plain body",
		"Content-Type", "application/octet-stream")
	want(t, r, http.StatusOK, "")
	if r = e.do("GET", "/files?path=signed.txt&signature="+url.QueryEscape(sig("signed.txt", "read", "")), "", nil); string(r.body) != "plain body" {
		t.Fatalf("signed download: %d %s", r.status, r.body)
	}
	if r = e.do("GET", "/files?path=signed.txt&signature="+url.QueryEscape(sig("signed.txt", "write", "")), "", nil); r.status != 401 {
		t.Fatalf("a write signature used to read: %d %s", r.status, r.body)
	}
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	r = e.do("GET", "/files?path=signed.txt&signature_expiration="+past+"&signature="+url.QueryEscape(sig("signed.txt", "read", past)), "", nil)
	if r.status != 401 || r.json(t)["message"] != "signature is already expired" {
		t.Fatalf("expired signature: %d %s", r.status, r.body)
	}
	// Without a token or signature, files are refused.
	if r = e.do("GET", "/files?path=signed.txt", "", nil, "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49983"); r.status != 401 {
		t.Fatalf("unauthenticated download: %d", r.status)
	}
}

func TestE2BInterpreter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "code-interpreter-v1"})
	interp := func(method, path string, body any, token string) resp {
		hdr := []string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49999"}
		if token != "" {
			hdr = append(hdr, "X-Access-Token", token)
		}
		return e.do(method, path, "", body, hdr...)
	}
	// Calls with the traffic token only, as the code-interpreter SDK makes them.
	traffic := func(method, path string, body any) resp {
		return e.do(method, path, "", body, "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49999", "E2B-Traffic-Access-Token", sb.Traffic)
	}
	lines := func(r resp) []map[string]any {
		t.Helper()
		if r.status != 200 {
			t.Fatalf("execute: %d %s", r.status, r.body)
		}
		var out []map[string]any
		dec := json.NewDecoder(bytes.NewReader(r.body))
		for {
			var m map[string]any
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("NDJSON: %v in %s", err, r.body)
			}
			if m["type"] != "keepalive" {
				out = append(out, m)
			}
		}
		return out
	}
	if r := interp("POST", "/execute", map[string]any{"code": "1"}, ""); r.status != 401 {
		t.Fatalf("execute without a token: %d", r.status)
	}
	ls := lines(interp("POST", "/execute", map[string]any{"code": "print('hi')\nx = 41\nx + 1", "env_vars": map[string]string{"X": "1"}}, sb.Token))
	types := []string{}
	for _, l := range ls {
		types = append(types, l["type"].(string))
	}
	if strings.Join(types, ",") != "number_of_executions,stdout,result,end_of_execution" ||
		ls[0]["execution_count"] != 1.0 || ls[1]["text"] != "hi\n" || ls[2]["text"] != "42" || ls[2]["is_main_result"] != true {
		t.Fatalf("lines: %v", ls)
	}
	ls = lines(interp("POST", "/execute", map[string]any{"code": "x / 0"}, sb.Token))
	if ls[0]["execution_count"] != 2.0 || ls[1]["type"] != "error" || ls[1]["name"] != "ZeroDivisionError" || ls[1]["traceback"] == "" {
		t.Fatalf("error lines: %v", ls)
	}
	// Both are in the sandbox's execution history, as /v1's are.
	r := e.do("GET", "/v1/sandboxes/"+sb.ID+"/executions", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	hist := r.json(t)["executions"].([]any)
	if len(hist) != 2 {
		t.Fatalf("history: %s", r.body)
	}
	last, first := hist[0].(map[string]any), hist[1].(map[string]any)
	out1, _ := first["output"].(map[string]any)
	if first["code"] != "print('hi')\nx = 41\nx + 1" || first["status"] != "success" || first["language"] != "python" || out1["stdout"] != "hi\n" {
		t.Fatalf("first recorded: %v", first)
	}
	if res, _ := out1["results"].([]any); len(res) != 1 || res[0].(map[string]any)["text"] != "42" {
		t.Fatalf("first recorded results: %v", out1)
	}
	out2, _ := last["output"].(map[string]any)
	if errObj, _ := out2["error"].(map[string]any); last["status"] != "error" || errObj["name"] != "ZeroDivisionError" {
		t.Fatalf("second recorded: %v", last)
	}
	if id, _ := first["id"].(string); !strings.HasPrefix(id, "exe_") {
		t.Fatalf("recorded id %q", id)
	}
	if r := interp("POST", "/execute", map[string]any{"code": "1", "language": "python", "context_id": "x"}, sb.Token); r.status != 400 {
		t.Fatalf("context and language: %d", r.status)
	}
	if r := interp("POST", "/execute", map[string]any{"code": "1", "context_id": "nope"}, sb.Token); r.status != 404 {
		t.Fatalf("unknown context: %d %s", r.status, r.body)
	}
	if r := interp("POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, sb.Token); r.status != 400 {
		t.Fatalf("unknown language: %d %s", r.status, r.body)
	}

	// Contexts: create (traffic token only, as the SDK sends), isolated state, list, restart, delete.
	if r := interp("POST", "/contexts", map[string]any{"language": "python"}, ""); r.status != 401 {
		t.Fatalf("contexts without a token: %d", r.status)
	}
	r = traffic("POST", "/contexts", map[string]any{"language": "python"})
	want(t, r, http.StatusOK, "")
	c := r.json(t)
	cid, _ := c["id"].(string)
	if cid == "" || c["language"] != "python" || c["cwd"] != "/home/user" {
		t.Fatalf("context: %s", r.body)
	}
	ls = lines(interp("POST", "/execute", map[string]any{"code": "'x' in globals()", "context_id": cid}, sb.Token))
	if ls[0]["execution_count"] != 1.0 || ls[1]["text"] != "False" {
		t.Fatalf("new context not isolated: %v", ls)
	}
	r = traffic("GET", "/contexts", nil)
	if !strings.Contains(string(r.body), cid) {
		t.Fatalf("list: %s", r.body)
	}
	want(t, traffic("POST", "/contexts/"+cid+"/restart", nil), http.StatusOK, "")
	want(t, traffic("DELETE", "/contexts/"+cid, nil), http.StatusOK, "")
	if r = traffic("DELETE", "/contexts/"+cid, nil); r.status != 404 {
		t.Fatalf("delete twice: %d", r.status)
	}
	if r = interp("POST", "/contexts", map[string]any{"language": "python"}, "wrong"); r.status != 401 {
		t.Fatalf("wrong token: %d", r.status)
	}
	// Other ports go to the preview proxy: nothing listens on this one.
	if r = e.do("GET", "/", "", nil, "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", strconv.Itoa(closedPort(t))); r.status != 502 {
		t.Fatalf("closed port: %d", r.status)
	}
}

// TestE2BListMany pages and filters GET /v2/sandboxes over more sandboxes
// than one small page holds, in both orders, as the SDK's paginator does.
func TestE2BListMany(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	const n = 55
	created := map[string]int{} // id → creation index
	for i := range n {
		sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base",
			"metadata": map[string]string{"batch": "many", "parity": strconv.Itoa(i % 2)}})
		created[sb.ID] = i
	}
	e.e2bCreate(e.keyB, map[string]any{"templateID": "base", "metadata": map[string]string{"batch": "many"}})

	// all pages the paginator would fetch, following X-Next-Token
	pages := func(query string, limit int) ([]map[string]any, int) {
		var all []map[string]any
		next, calls := "", 0
		for {
			q := query + "&limit=" + strconv.Itoa(limit)
			if next != "" {
				q += "&nextToken=" + url.QueryEscape(next)
			}
			r := e.e2bDo("GET", "/v2/sandboxes?"+q, e.keyA, nil)
			want(t, r, http.StatusOK, "")
			var items []map[string]any
			if err := json.Unmarshal(r.body, &items); err != nil {
				t.Fatal(err)
			}
			calls++
			if len(items) > limit {
				t.Fatalf("%d items on a page of %d", len(items), limit)
			}
			all = append(all, items...)
			if next = r.header.Get("X-Next-Token"); next == "" {
				return all, calls
			}
			if calls > n {
				t.Fatal("the paging does not end")
			}
		}
	}
	check := func(name string, items []map[string]any, wantIDs func(i int) bool, asc bool) {
		t.Helper()
		seen := map[string]bool{}
		var last time.Time
		for k, it := range items {
			id := it["sandboxID"].(string)
			i, ok := created[id]
			if !ok || seen[id] || !wantIDs(i) {
				t.Fatalf("%s: item %d is %s (known %v, seen %v)", name, k, id, ok, seen[id])
			}
			seen[id] = true
			at, err := time.Parse(time.RFC3339Nano, it["startedAt"].(string))
			if err != nil {
				t.Fatal(err)
			}
			if k > 0 && (asc && at.Before(last) || !asc && at.After(last)) {
				t.Fatalf("%s: out of order at %d: %v after %v", name, k, at, last)
			}
			last = at
		}
		for id, i := range created {
			if wantIDs(i) && !seen[id] {
				t.Fatalf("%s: %s (created %d) missing from %d items", name, id, i, len(items))
			}
		}
	}
	all, calls := pages("metadata="+url.QueryEscape("batch=many"), 10)
	check("all, newest first", all, func(int) bool { return true }, false)
	if calls != 6 {
		t.Errorf("55 items in pages of 10 took %d calls, want 6", calls)
	}
	asc, _ := pages("order=asc&metadata="+url.QueryEscape("batch=many"), 7)
	check("all, oldest first", asc, func(int) bool { return true }, true)
	odd, _ := pages("state=running&metadata="+url.QueryEscape("batch=many&parity=1"), 4)
	check("odd", odd, func(i int) bool { return i%2 == 1 }, false)
	if len(odd) != n/2 {
		t.Errorf("%d odd ones, want %d", len(odd), n/2)
	}
	full, calls := pages("metadata="+url.QueryEscape("batch=many"), 100)
	if len(full) != n || calls != 1 {
		t.Errorf("a page of 100: %d items in %d calls", len(full), calls)
	}
	// The v1 list (older SDKs) has no pages: every match at once, newest
	// first, filtered the same way, only the key owner's.
	for q, wantIDs := range map[string]func(int) bool{
		"batch=many":          func(int) bool { return true },
		"batch=many&parity=0": func(i int) bool { return i%2 == 0 },
	} {
		r := e.e2bDo("GET", "/sandboxes?metadata="+url.QueryEscape(q), e.keyA, nil)
		want(t, r, http.StatusOK, "")
		var items []map[string]any
		if err := json.Unmarshal(r.body, &items); err != nil {
			t.Fatal(err)
		}
		check("v1 "+q, items, wantIDs, false)
	}
}
