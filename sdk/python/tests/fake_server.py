"""An in-memory fake of the Sheepfold REST API v1 (docs/api-v1.md), just
enough to check the SDK's requests and its handling of the responses.

It records every request (method, path, query, headers, body) in
``server.requests``; ``server.inject(status, body, headers)`` makes the
next request(s) fail with a canned response before any routing.

Code execution is scripted: each line of the code is a command
    out:TEXT     a stdout chunk        err:TEXT    a stderr chunk
    result:TEXT  a main result (text)  png         a display result with png
    raise:N:V    an error N: V         sleep:S     wait S seconds
    wait         (streaming) wait until the test sets server.gate
    timeout      status "timeout", error_code ERR_SANDBOX_TIMEOUT
    failure      (streaming) a mid-stream {"type":"failure"} line
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

API_KEY = "sk_test_0123456789"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfakepng").decode()
NOW = "2026-12-02T10:00:00.123456789Z"
LATER = "2026-12-02T10:05:00Z"


class Recorded:
    def __init__(self, method: str, path: str, query: Dict[str, List[str]], headers: Any, body: bytes) -> None:
        self.method, self.path, self.query, self.headers, self.body = method, path, query, headers, body

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def q(self, name: str) -> Optional[str]:
        v = self.query.get(name)
        return v[0] if v else None

    def __repr__(self) -> str:
        return f"<{self.method} {self.path} {self.query}>"


class FakeSheepfold(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: List[Recorded] = []
        self.injected: List[Tuple[int, Any, Dict[str, str]]] = []
        self.sandboxes: Dict[str, Dict[str, Any]] = {}
        self.snapshots: Dict[str, Dict[str, Any]] = {}
        self.snapshot_pools: Dict[str, int] = {}
        self.forks: Dict[str, str] = {}
        self.files: Dict[str, Dict[str, bytes]] = {}
        self.dirs: Dict[str, set] = {}
        self.contexts: Dict[str, Dict[str, Dict[str, Any]]] = {}
        self.processes: Dict[str, Dict[int, Dict[str, Any]]] = {}
        self.stdin: List[Tuple[int, Dict[str, Any]]] = []
        self.signals: List[Tuple[int, Any]] = []
        self.gate = threading.Event()
        self.gate_was_open_in_time: Optional[bool] = None
        self.lock = threading.Lock()
        self.next_id = 0
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> "FakeSheepfold":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up on purpose (request_timeout tests) is not an error.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def inject(self, status: int, body: Any = None, headers: Optional[Dict[str, str]] = None, times: int = 1) -> None:
        for _ in range(times):
            self.injected.append((status, body, headers or {}))

    def calls(self, method: Optional[str] = None, path_re: Optional[str] = None) -> List[Recorded]:
        return [r for r in self.requests
                if (method is None or r.method == method) and (path_re is None or re.fullmatch(path_re, r.path))]

    def new_id(self, prefix: str) -> str:
        with self.lock:
            self.next_id += 1
            return f"{prefix}{self.next_id}"


def err(code: str, message: str, status: int) -> Tuple[int, Any, Dict[str, str]]:
    return status, {"error": {"code": code, "message": message, "request_id": "req_fake"}}, {}


def norm(path: str) -> str:
    if not path.startswith("/"):
        path = "/home/user/" + path
    parts: List[str] = []
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if parts:
                parts.pop()
            continue
        parts.append(p)
    return "/" + "/".join(parts)


def file_info(path: str, size: int = 0, typ: str = "file") -> Dict[str, Any]:
    return {"name": path.rsplit("/", 1)[-1], "path": path, "type": typ, "size": size,
            "mode": 0o644 if typ == "file" else 0o755, "mod_time": NOW, "owner": "user", "group": "user"}


class Handler(BaseHTTPRequestHandler):
    server: FakeSheepfold
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    # Plumbing.

    def _handle(self) -> None:
        u = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        rec = Recorded(self.command, u.path, parse_qs(u.query, keep_blank_values=True), self.headers, body)
        self.server.requests.append(rec)
        self.rec = rec
        if self.server.injected:
            status, b, h = self.server.injected.pop(0)
            return self.send(status, b, h)
        if u.path == "/healthz":
            return self.send(200, {"status": "ok"})
        key = self.headers.get("X-API-Key")
        auth = self.headers.get("Authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        if key != API_KEY:
            return self.send(*err("ERR_AUTHENTICATION_FAILED", "invalid API key", 401))
        out = self.route(rec)
        if out is not None:
            self.send(*out)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def send(self, status: int, body: Any = None, headers: Optional[Dict[str, str]] = None) -> None:
        headers = dict(headers or {})
        if body is None:
            data = b""
        elif isinstance(body, bytes):
            data = body
            headers.setdefault("Content-Type", "application/octet-stream")
        else:
            data = json.dumps(body).encode() + b"\n"
            headers.setdefault("Content-Type", "application/json")
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("X-Request-Id", "req_fake")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def line(self, obj: Any) -> None:
        self.wfile.write(json.dumps(obj).encode() + b"\n")
        self.wfile.flush()

    def streaming(self, rec: Recorded) -> bool:
        return rec.q("stream") in ("1", "true", "ndjson") or "application/x-ndjson" in (rec.headers.get("Accept") or "")

    # Routing.

    def route(self, rec: Recorded) -> Optional[Tuple[int, Any, Dict[str, str]]]:
        m, p = rec.method, rec.path
        if p == "/v1/sandboxes":
            if m == "POST":
                return self.create(rec)
            if m == "GET":
                want = rec.q("state")
                sbs = [s for s in self.server.sandboxes.values()
                       if want == "all" or s["state"] == want or want is None and s["state"] in ("running", "paused")]
                return 200, {"sandboxes": sbs}, {}
        if p == "/v1/snapshots" and m == "GET":
            return 200, {"snapshots": list(self.server.snapshots.values())}, {}
        mp = re.fullmatch(r"/v1/snapshots/([^/]+)/pool", p)
        if mp:
            if mp.group(1) not in self.server.snapshots:
                return err("ERR_NOT_FOUND", f"no snapshot {mp.group(1)!r}", 404)
            if m == "POST":
                self.server.snapshot_pools[mp.group(1)] = rec.json()["size"]
            size = self.server.snapshot_pools.get(mp.group(1), 0)
            return 200, {"snapshot": mp.group(1), "size": size, "ready": size}, {}
        ms = re.fullmatch(r"/v1/snapshots/([^/]+)", p)
        if ms:
            snap = self.server.snapshots.get(ms.group(1))
            if snap is None:
                return err("ERR_NOT_FOUND", f"no snapshot {ms.group(1)!r}", 404)
            if m == "DELETE":
                del self.server.snapshots[snap["name"]]
                return 204, None, {}
            return 200, snap, {}
        mt = re.fullmatch(r"/v1/sandboxes/([^/]+)(/.*)?", p)
        if not mt:
            return err("ERR_NOT_FOUND", f"no route {m} {p}", 404)
        sid, rest = mt.group(1), mt.group(2) or ""
        sb = self.server.sandboxes.get(sid)
        if sb is None:
            return err("ERR_SANDBOX_NOT_FOUND", f"sandbox {sid!r} not found", 404)
        if rest == "/pause" and m == "POST" and sb["state"] in ("running", "paused"):
            sb["state"] = "paused"
            return 200, sb, {}
        if sb["state"] == "paused" and not (rest == "" and m == "GET"):
            sb["state"] = "running"  # any other request resumes it, as the real server
        if rest == "/resume" and m == "POST" and sb["state"] == "running":
            return 200, sb, {}
        if sb["state"] not in ("running", "paused"):
            # As the real server: a stopped sandbox of yours still shows,
            # deleting it again is a no-op, anything else is a state error.
            if rest == "" and m == "GET":
                return 200, sb, {}
            if rest == "" and m == "DELETE":
                return 204, None, {}
            return err("ERR_SANDBOX_STATE", f"sandbox {sid} is stopped (killed)", 409)
        if rest == "":
            if m == "GET":
                return 200, sb, {}
            if m == "DELETE":
                sb["state"] = "stopped"
                sb["stop_reason"] = "killed"
                return 204, None, {}
        if rest == "/fork" and m == "POST":
            out = []
            for _ in range(rec.json().get("count", 1)):
                fid = self.server.new_id("sbx_")
                self.server.sandboxes[fid] = dict(sb, id=fid)
                self.server.forks[fid] = sid
                out.append(self.server.sandboxes[fid])
            return 201, {"sandboxes": out}, {}
        if rest == "/diff" and m == "GET":
            if self.server.forks.get(sid) != rec.q("against"):
                return err("ERR_NOT_FOUND", f"{sid} is not a fork of {rec.q('against')}", 404)
            return 200, {"against": rec.q("against"), "added": ["/home/user/new.txt"], "changed": [], "deleted": []}, {}
        if rest == "/adopt" and m == "POST":
            if sid not in self.server.forks:
                return err("ERR_NOT_FOUND", f"{sid} is not a fork", 404)
            return 200, {"parent": self.server.forks[sid], "copied": ["/home/user/new.txt"], "deleted": [],
                         "skipped": [{"path": "/home/user/link", "reason": "symlink"}]}, {}
        if rest == "/snapshots" and m == "POST":
            name = rec.json()["name"]
            if name in self.server.snapshots:
                return err("ERR_CONFLICT", f"a snapshot named {name!r} exists", 409)
            snap = {"name": name, "sandbox_id": sid, "template": sb["template"], "resources": sb["resources"],
                    "created_at": NOW, "size_bytes": 4096}
            self.server.snapshots[name] = snap
            return 201, snap, {}
        if rest == "/timeout" and m == "POST":
            sb["expires_at"] = LATER
            sb["timeout_seen"] = rec.json()["timeout"]
            return 200, sb, {}
        if rest == "/execute" and m == "POST":
            return self.execute(rec, sid)
        if rest.startswith("/contexts"):
            return self.contexts(rec, sid, rest)
        if rest.startswith("/commands"):
            return self.commands(rec, sid, rest)
        if rest.startswith("/files"):
            return self.files(rec, sid, rest)
        if rest.startswith("/ports"):
            return self.ports(rec, sid, sb, rest)
        return err("ERR_NOT_FOUND", f"no route {m} {p}", 404)

    def ports(self, rec: Recorded, sid: str, sb: Dict[str, Any], rest: str) -> Tuple[int, Any, Dict[str, str]]:
        # Port 8000 listens in every fake sandbox; others once made public.
        public = sb.setdefault("public_ports", set())

        def entry(port: int) -> Dict[str, Any]:
            proxy = f"{self.server.url}/v1/sandboxes/{sid}/proxy/{port}/"
            return {"port": port, "listening": port == 8000, "addresses": ["127.0.0.1"] if port == 8000 else [],
                    "public": port in public, "proxy_url": proxy, "signed_url": proxy + "?sf_preview=123.abc",
                    "signed_url_expires_at": LATER}
        if rest == "/ports" and rec.method == "GET":
            sb["ports_expires_in"] = rec.q("expires_in")
            return 200, {"ports": [entry(p) for p in sorted({8000} | public)], "token": "sfp_fake",
                         "token_header": "Sheepfold-Preview-Token"}, {}
        mt = re.fullmatch(r"/ports/([0-9]+)", rest)
        if mt and rec.method == "PUT":
            port = int(mt.group(1))
            if not 1 <= port <= 65535:
                return err("ERR_BAD_REQUEST", "port must be a number between 1 and 65535", 400)
            if rec.json().get("public"):
                public.add(port)
            else:
                public.discard(port)
            return 200, entry(port), {}
        return err("ERR_NOT_FOUND", f"no route {rec.method} {rec.path}", 404)

    def create(self, rec: Recorded) -> Tuple[int, Any, Dict[str, str]]:
        try:
            req = rec.json() or {}
        except ValueError:
            return err("ERR_BAD_REQUEST", "malformed JSON", 400)
        allowed = {"template", "timeout", "resources", "env", "metadata", "sandbox_config", "snapshot", "auto_pause"}
        unknown = set(req) - allowed
        if unknown:
            return err("ERR_BAD_REQUEST", f"unknown field {sorted(unknown)[0]!r}", 400)
        if "snapshot" in req:
            snap = self.server.snapshots.get(req["snapshot"])
            if snap is None:
                return err("ERR_NOT_FOUND", f"no snapshot {req['snapshot']!r}", 404)
            req = {"template": snap["template"], "resources": snap["resources"], "metadata": req.get("metadata")}
        if req.get("template") == "nope":
            return err("ERR_TEMPLATE_NOT_FOUND", "no template nope", 404)
        if (req.get("sandbox_config") or {}).get("network_restricted") is False:
            return err("ERR_NETWORK_RESTRICTED", "egress is not available yet", 403)
        sid = self.server.new_id("sbx_")
        sb = {"id": sid, "template": req.get("template", "python"), "state": "running",
              "created_at": NOW, "expires_at": LATER,
              "resources": req.get("resources") or {"cpus": 1, "memory_mb": 512, "disk_mb": 256, "pids": 256},
              "metadata": req.get("metadata") or {}}
        if req.get("auto_pause"):
            sb["auto_pause"] = True
        self.server.sandboxes[sid] = sb
        self.server.files[sid] = {}
        self.server.dirs[sid] = {"/home/user"}
        self.server.contexts[sid] = {}
        self.server.processes[sid] = {}
        return 201, sb, {}

    # Execute.

    def execute(self, rec: Recorded, sid: str) -> Optional[Tuple[int, Any, Dict[str, str]]]:
        req = rec.json()
        unknown = set(req) - {"code", "language", "context_id", "timeout_ms", "env"}
        if unknown:
            return err("ERR_BAD_REQUEST", f"unknown field {sorted(unknown)[0]!r}", 400)
        if req.get("language") not in (None, "python", "javascript", "bash"):
            return err("ERR_UNSUPPORTED_LANGUAGE", "no such language", 400)
        events: List[Dict[str, Any]] = []
        ex: Dict[str, Any] = {"status": "success", "stdout": "", "stderr": "", "results": [], "error": None,
                              "truncated": False, "execution_time_ms": 12.5, "cpu_time_ms": 10.25,
                              "peak_memory_bytes": 1048576}
        stream = self.streaming(rec)
        if stream:
            self.start_stream()
        for cmd in req["code"].splitlines():
            ev: Optional[Dict[str, Any]] = None
            if cmd.startswith("out:"):
                ex["stdout"] += cmd[4:]
                ev = {"type": "stdout", "text": cmd[4:]}
            elif cmd.startswith("err:"):
                ex["stderr"] += cmd[4:]
                ev = {"type": "stderr", "text": cmd[4:]}
            elif cmd.startswith("result:"):
                r = {"text": cmd[7:], "is_main_result": True}
                ex["results"].append(r)
                ev = {"type": "result", "result": r}
            elif cmd == "png":
                r = {"text": "<Figure size 640x480 with 1 Axes>", "png": PNG}
                ex["results"].append(r)
                ev = {"type": "result", "result": r}
            elif cmd.startswith("raise:"):
                _, name, value = cmd.split(":", 2)
                ex["error"] = {"name": name, "value": value, "traceback": f"Traceback...\n{name}: {value}"}
                ex["status"] = "error"
                ev = {"type": "error", "error": ex["error"]}
            elif cmd.startswith("sleep:"):
                time.sleep(float(cmd[6:]))
            elif cmd == "wait" and stream:
                self.server.gate_was_open_in_time = self.server.gate.wait(5)
            elif cmd == "timeout":
                ex["status"] = "timeout"
                ex["error_code"] = "ERR_SANDBOX_TIMEOUT"
            elif cmd == "failure" and stream:
                self.line({"type": "failure", "error": {"code": "ERR_SANDBOX_STATE",
                                                        "message": "the sandbox stopped", "request_id": "req_fake"}})
                return None
            if ev is not None:
                events.append(ev)
                if stream:
                    self.line(ev)
        if not stream:
            return 200, ex, {}
        self.line({"type": "done", "execution": ex})
        return None

    # Contexts.

    def contexts(self, rec: Recorded, sid: str, rest: str) -> Tuple[int, Any, Dict[str, str]]:
        ctxs = self.server.contexts[sid]
        if rest == "/contexts" and rec.method == "POST":
            req = rec.json() or {}
            c = {"id": self.server.new_id("ctx_"), "language": req.get("language", "python"),
                 "cwd": req.get("cwd", "/home/user")}
            ctxs[c["id"]] = c
            return 201, c, {}
        if rest == "/contexts" and rec.method == "GET":
            return 200, {"contexts": list(ctxs.values())}, {}
        mt = re.fullmatch(r"/contexts/([^/]+)(/restart)?", rest)
        if mt and mt.group(1) in ctxs:
            if mt.group(2) and rec.method == "POST":
                return 200, ctxs[mt.group(1)], {}
            if not mt.group(2) and rec.method == "DELETE":
                del ctxs[mt.group(1)]
                return 204, None, {}
        return err("ERR_NOT_FOUND", "no such context", 404)

    # Commands.

    def commands(self, rec: Recorded, sid: str, rest: str) -> Optional[Tuple[int, Any, Dict[str, str]]]:
        procs = self.server.processes[sid]
        if rest == "/commands" and rec.method == "POST":
            req = rec.json()
            unknown = set(req) - {"cmd", "args", "env", "cwd", "timeout_ms", "background", "stdin"}
            if unknown:
                return err("ERR_BAD_REQUEST", f"unknown field {sorted(unknown)[0]!r}", 400)
            pid = 100 + len(procs)
            if req.get("background"):
                procs[pid] = {"pid": pid, "cmd": req["cmd"], "args": req.get("args") or [],
                              "cwd": req.get("cwd") or "/home/user", "tag": "", "started": NOW}
                return 202, {"pid": pid}, {}
            script = (req.get("args") or [""])[-1]
            code = 0
            out, errs = [], []
            for part in script.split(";"):
                part = part.strip()
                if part.startswith("echo "):
                    out.append(part[5:] + "\n")
                elif part.startswith("warn "):
                    errs.append(part[5:] + "\n")
                elif part.startswith("exit "):
                    code = int(part[5:])
            res = {"pid": pid, "exit_code": code, "signal": 0, "status": "exited",
                   "stdout": "".join(out), "stderr": "".join(errs), "truncated": False}
            if not self.streaming(rec):
                return 200, res, {}
            self.start_stream()
            self.line({"type": "start", "pid": pid})
            for o in out:
                self.line({"type": "stdout", "text": o})
            for e in errs:
                self.line({"type": "stderr", "text": e})
            # As the real server: a streamed done event has no output of its own.
            self.line({"type": "done", "command": dict(res, stdout="", stderr="")})
            return None
        if rest == "/commands" and rec.method == "GET":
            return 200, {"processes": list(procs.values())}, {}
        mt = re.fullmatch(r"/commands/(\d+)/(stream|input|signal)", rest)
        if not mt or int(mt.group(1)) not in procs:
            return err("ERR_NOT_FOUND", "no such process", 404)
        pid, op = int(mt.group(1)), mt.group(2)
        if op == "input" and rec.method == "POST":
            self.server.stdin.append((pid, rec.json()))
            return 204, None, {}
        if op == "signal" and rec.method == "POST":
            self.server.signals.append((pid, rec.json()["signal"]))
            del procs[pid]
            return 204, None, {}
        if op == "stream" and rec.method == "GET":
            if not self.streaming(rec):
                return err("ERR_BAD_REQUEST", "the fake only streams NDJSON", 400)
            self.start_stream()
            self.line({"type": "stdout", "text": "tick 1\n"})
            self.line({"type": "stderr", "text": "oops\n"})
            self.line({"type": "stdout", "text": "tick 2\n"})
            self.line({"type": "done", "command": {"pid": pid, "exit_code": 3, "signal": 0, "status": "exited",
                                                   "stdout": "tick 1\ntick 2\n", "stderr": "oops\n",
                                                   "truncated": False}})
            del procs[pid]
            return None
        return err("ERR_NOT_FOUND", "no route", 404)

    # Files.

    def files(self, rec: Recorded, sid: str, rest: str) -> Tuple[int, Any, Dict[str, str]]:
        fs, dirs = self.server.files[sid], self.server.dirs[sid]
        m = rec.method
        if rest == "/files":
            raw = rec.q("path")
            if m == "POST":
                d = norm(raw or "/home/user")
                ctype = rec.headers.get("Content-Type", "")
                if not ctype.startswith("multipart/form-data"):
                    return err("ERR_BAD_REQUEST", "the body must be multipart/form-data", 400)
                msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                    b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + rec.body)
                out = []
                for part in msg.iter_parts():
                    if part.get_param("name", header="content-disposition") != "file":
                        return err("ERR_BAD_REQUEST", "every part must be named file", 400)
                    path = d + "/" + part.get_filename()
                    data = part.get_payload(decode=True)
                    fs[path] = data
                    out.append(file_info(path, len(data)))
                return 201, {"files": out}, {}
            if not raw:
                return err("ERR_BAD_REQUEST", "the path query parameter is required", 400)
            path = norm(raw)
            if m == "GET":
                if path not in fs:
                    return err("ERR_NOT_FOUND", f"{path}: no such file", 404)
                return 200, fs[path], {}
            if m == "PUT":
                if len(rec.body) > 1000:
                    return err("ERR_FILE_TOO_LARGE", "the file is larger than the upload limit of 0 MiB", 413)
                fs[path] = rec.body
                return 201, file_info(path, len(rec.body)), {}
            if m == "DELETE":
                if path in fs:
                    del fs[path]
                elif path in dirs:
                    dirs.discard(path)
                else:
                    return err("ERR_NOT_FOUND", f"{path}: no such file", 404)
                return 204, None, {}
        if rest == "/files/list" and m == "GET":
            d = norm(rec.q("path") or "")
            entries = [file_info(p, len(b)) for p, b in sorted(fs.items()) if p.rsplit("/", 1)[0] == d]
            entries += [file_info(p, 0, "dir") for p in sorted(dirs) if p.rsplit("/", 1)[0] == d]
            entries.sort(key=lambda e: e["path"])
            # Pages of limit (here 3 by default); the cursor is the last path.
            cursor, limit = rec.q("cursor"), int(rec.q("limit") or 3)
            if cursor is not None:
                if not cursor.startswith(d + "/"):
                    return err("ERR_BAD_REQUEST", "cursor belongs to another listing", 400)
                entries = [e for e in entries if e["path"] > cursor]
            page = {"entries": entries[:limit], "truncated": len(entries) > limit}
            if len(entries) > limit:
                page["next_cursor"] = entries[limit - 1]["path"]
            return 200, page, {}
        if rest == "/files/stat" and m == "GET":
            path = norm(rec.q("path") or "")
            if path in fs:
                return 200, file_info(path, len(fs[path])), {}
            if path in dirs:
                return 200, file_info(path, 0, "dir"), {}
            return err("ERR_NOT_FOUND", f"{path}: no such file", 404)
        if rest == "/files/mkdir" and m == "POST":
            path = norm(rec.json()["path"])
            dirs.add(path)
            return 201, file_info(path, 0, "dir"), {}
        if rest == "/files/move" and m == "POST":
            req = rec.json()
            a, b = norm(req["from"]), norm(req["to"])
            if a not in fs:
                return err("ERR_NOT_FOUND", f"{a}: no such file", 404)
            fs[b] = fs.pop(a)
            return 200, file_info(b, len(fs[b])), {}
        return err("ERR_NOT_FOUND", "no route", 404)
