"""Unit tests of the SDK against an in-process fake of the v1 API (fake_server.py)."""

from __future__ import annotations

import base64
import os
import threading
import time
import unittest
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from unittest import mock

import fake_server
from fake_server import API_KEY, PNG, FakeSheepfold

import sheepfold
from sheepfold import (
    AuthenticationError,
    CodeContext,
    CommandHandle,
    CommandResult,
    ConflictError,
    Execution,
    ExecutionError,
    FileInfo,
    FileTooLargeError,
    InvalidArgumentError,
    NetworkRestrictedError,
    NotFoundError,
    RateLimitError,
    Result,
    Sandbox,
    SandboxNotFoundError,
    SandboxStateError,
    SandboxTimeoutError,
    SheepfoldConnectionError,
    SheepfoldError,
    TemplateNotFoundError,
    UnsupportedLanguageError,
)
from sheepfold._http import HTTPClient, parse_retry_after
from sheepfold.errors import error_for
from sheepfold.models import parse_time


class FakeServerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = FakeSheepfold().start()
        self.addCleanup(self.server.stop)
        env = mock.patch.dict(os.environ, {"SHEEPFOLD_API_KEY": API_KEY, "SHEEPFOLD_URL": self.server.url})
        env.start()
        self.addCleanup(env.stop)

    def sandbox(self, **kw) -> Sandbox:
        sb = Sandbox.create(**kw)
        self.addCleanup(lambda: sb.kill())
        return sb


class TestSandboxLifecycle(FakeServerTest):
    def test_create_sends_contract_body_and_auth(self) -> None:
        sb = Sandbox.create(template="python", timeout=30, metadata={"k": "v"}, envs={"A": "1"},
                            resources={"cpus": 2, "memory_mb": 1024, "disk_mb": 256, "pids": 64},
                            sandbox_config={"max_execution_time": 30, "network_restricted": True})
        req = self.server.calls("POST", "/v1/sandboxes")[0]
        self.assertEqual(req.headers["Authorization"], f"Bearer {API_KEY}")
        self.assertTrue(req.headers["Content-Type"].startswith("application/json"))
        self.assertTrue(req.headers["User-Agent"].startswith("sheepfold-python/"))
        self.assertTrue(req.headers["X-Request-Id"])
        self.assertEqual(req.json(), {
            "template": "python", "timeout": 30, "metadata": {"k": "v"}, "env": {"A": "1"},
            "resources": {"cpus": 2, "memory_mb": 1024, "disk_mb": 256, "pids": 64},
            "sandbox_config": {"max_execution_time": 30, "network_restricted": True}})
        self.assertEqual(sb.sandbox_id, "sbx_1")
        self.assertEqual(sb.info.state, "running")
        self.assertEqual(sb.info.template, "python")
        self.assertEqual(sb.info.resources.memory_mb, 1024)
        self.assertEqual(sb.info.metadata, {"k": "v"})
        self.assertEqual(sb.info.created_at, datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=timezone.utc))
        sb.kill()

    def test_create_auto_pause(self) -> None:
        sb = Sandbox.create(auto_pause=True)
        self.assertEqual(self.server.calls("POST", "/v1/sandboxes")[0].json(), {"auto_pause": True})
        self.assertTrue(sb.info.auto_pause)
        self.assertFalse(self.sandbox().info.auto_pause)

    def test_create_minimal_sends_empty_object(self) -> None:
        sb = self.sandbox()
        self.assertEqual(self.server.calls("POST", "/v1/sandboxes")[0].json(), {})
        self.assertEqual(sb.info.template, "python")

    def test_explicit_key_and_url_override_env(self) -> None:
        with mock.patch.dict(os.environ, {"SHEEPFOLD_API_KEY": "wrong", "SHEEPFOLD_URL": "http://127.0.0.1:1"}):
            sb = Sandbox.create(api_key=API_KEY, base_url=self.server.url + "/")
            sb.kill()
        self.assertEqual(len(self.server.calls("DELETE")), 1)

    def test_context_manager_kills_sandbox(self) -> None:
        with Sandbox.create() as sb:
            sid = sb.sandbox_id
            self.assertTrue(sb.is_running())
        deletes = self.server.calls("DELETE", f"/v1/sandboxes/{sid}")
        self.assertEqual(len(deletes), 1)
        self.assertEqual(self.server.sandboxes[sid]["state"], "stopped")

    def test_context_manager_kills_on_exception_and_keeps_it(self) -> None:
        with self.assertRaises(ZeroDivisionError):
            with Sandbox.create() as sb:
                1 / 0
        self.assertEqual(len(self.server.calls("DELETE", f"/v1/sandboxes/{sb.sandbox_id}")), 1)

    def test_kill_and_is_running(self) -> None:
        sb = Sandbox.create()
        self.assertTrue(sb.kill())
        self.assertTrue(sb.kill())  # a stopped sandbox: DELETE is a no-op 204
        self.assertFalse(sb.is_running())
        self.assertEqual(sb.info.state, "stopped")
        with self.assertRaises(SandboxStateError) as cm:
            sb.run_code("1")
        self.assertEqual((cm.exception.code, cm.exception.status), ("ERR_SANDBOX_STATE", 409))
        ghost = Sandbox(sheepfold.SandboxInfo(sandbox_id="sbx_unknown"), sb._http)
        self.assertFalse(ghost.kill())
        self.assertFalse(ghost.is_running())

    def test_connect_list_get_info_set_timeout(self) -> None:
        sb = self.sandbox(metadata={"who": "me"})
        sb2 = Sandbox.connect(sb.sandbox_id)
        self.assertEqual(sb2.sandbox_id, sb.sandbox_id)
        self.assertEqual(sb2.info.metadata, {"who": "me"})
        self.assertEqual([s.sandbox_id for s in Sandbox.list()], [sb.sandbox_id])
        Sandbox.list(all=True)
        self.assertEqual(self.server.calls("GET", "/v1/sandboxes")[-1].q("state"), "all")
        self.assertIsNone(self.server.calls("GET", "/v1/sandboxes")[0].q("state"))
        info = sb.set_timeout(600)
        req = self.server.calls("POST", r"/v1/sandboxes/.*/timeout")[0]
        self.assertEqual(req.json(), {"timeout": 600})
        self.assertEqual(info.expires_at, datetime(2026, 12, 2, 10, 5, tzinfo=timezone.utc))
        self.assertEqual(sb.get_info().sandbox_id, sb.sandbox_id)
        with self.assertRaises(SandboxNotFoundError) as cm:
            Sandbox.connect("sbx_missing")
        self.assertEqual(cm.exception.code, "ERR_SANDBOX_NOT_FOUND")
        self.assertEqual(cm.exception.status, 404)
        self.assertEqual(cm.exception.request_id, "req_fake")

    def test_snapshots(self) -> None:
        sb = self.sandbox()
        snap = sb.create_snapshot("warm")
        self.assertEqual((snap.name, snap.sandbox_id, snap.size_bytes), ("warm", sb.sandbox_id, 4096))
        self.assertEqual(self.server.calls("POST", r"/v1/sandboxes/.*/snapshots")[0].json(), {"name": "warm"})
        with self.assertRaises(ConflictError):
            sb.create_snapshot("warm")
        self.assertEqual([s.name for s in Sandbox.list_snapshots()], ["warm"])
        self.assertEqual(Sandbox.get_snapshot("warm").template, "python")
        copy = Sandbox.create(snapshot="warm")
        self.assertNotEqual(copy.sandbox_id, sb.sandbox_id)
        self.assertEqual(self.server.calls("POST", "/v1/sandboxes")[-1].json(), {"snapshot": "warm"})
        pool = Sandbox.set_snapshot_pool("warm", 2)
        self.assertEqual((pool.snapshot, pool.size, pool.ready), ("warm", 2, 2))
        self.assertEqual(self.server.calls("POST", "/v1/snapshots/warm/pool")[0].json(), {"size": 2})
        self.assertEqual(Sandbox.get_snapshot_pool("warm").size, 2)
        with self.assertRaises(NotFoundError):
            Sandbox.set_snapshot_pool("cold", 1)
        Sandbox.delete_snapshot("warm")
        with self.assertRaises(NotFoundError):
            Sandbox.get_snapshot("warm")

    def test_fork_diff(self) -> None:
        sb = self.sandbox()
        forks = sb.fork(count=2)
        self.assertEqual(self.server.calls("POST", r"/v1/sandboxes/.*/fork")[0].json(), {"count": 2})
        self.assertEqual(len({f.sandbox_id for f in forks} | {sb.sandbox_id}), 3)
        d = forks[0].diff(against=sb.sandbox_id)
        self.assertEqual((d.against, d.added), (sb.sandbox_id, ["/home/user/new.txt"]))
        self.assertEqual(self.server.calls("GET", r"/v1/sandboxes/.*/diff")[0].q("against"), sb.sandbox_id)
        with self.assertRaises(NotFoundError):
            forks[0].diff(against=forks[1].sandbox_id)
        a = forks[0].adopt()
        self.assertEqual((a.parent, a.copied, a.skipped[0]["path"]), (sb.sandbox_id, ["/home/user/new.txt"], "/home/user/link"))
        with self.assertRaises(NotFoundError):
            sb.adopt()

    def test_pause_resume(self) -> None:
        sb = self.sandbox()
        other = self.sandbox()
        self.assertEqual(sb.pause().state, "paused")
        self.assertEqual(self.server.calls("POST", r"/v1/sandboxes/.*/pause")[0].path, f"/v1/sandboxes/{sb.sandbox_id}/pause")
        self.assertEqual([s.sandbox_id for s in Sandbox.list(state="paused")], [sb.sandbox_id])
        self.assertEqual(self.server.calls("GET", "/v1/sandboxes")[-1].q("state"), "paused")
        self.assertEqual([s.sandbox_id for s in Sandbox.list(state="running")], [other.sandbox_id])
        self.assertEqual(len(Sandbox.list()), 2)
        self.assertEqual(sb.resume().state, "running")
        self.assertEqual(self.server.calls("POST", r"/v1/sandboxes/.*/resume")[0].path, f"/v1/sandboxes/{sb.sandbox_id}/resume")
        self.assertEqual(sb.pause(keep_memory=True).state, "paused")
        self.assertEqual(self.server.calls("POST", r"/v1/sandboxes/.*/pause")[-1].json(), {"memory": "keep"})
        self.assertEqual(self.server.calls("POST", r"/v1/sandboxes/.*/pause")[0].json(), {})
        sb.resume()
        self.server.inject(501, {"error": {"code": "ERR_NOT_SUPPORTED", "message": "this server's runtime (kubernetes) cannot pause sandboxes"}})
        with self.assertRaises(sheepfold.NotSupportedError) as cm:
            sb.pause()
        self.assertEqual((cm.exception.code, cm.exception.status), ("ERR_NOT_SUPPORTED", 501))

    def test_sandbox_id_is_path_escaped(self) -> None:
        with self.assertRaises(NotFoundError):
            Sandbox.connect("a/b?c")
        self.assertEqual(self.server.requests[-1].path, "/v1/sandboxes/a%2Fb%3Fc")


class TestPorts(FakeServerTest):
    def test_list_ports_public_and_preview_urls(self) -> None:
        sb = self.sandbox()
        ports = sb.list_ports(expires_in=600)
        self.assertEqual(self.server.sandboxes[sb.sandbox_id]["ports_expires_in"], "600")
        p = ports.get(8000)
        self.assertTrue(p.listening and not p.public)
        self.assertEqual(p.addresses, ["127.0.0.1"])
        self.assertEqual(p.preview_url, p.proxy_url)
        self.assertIsNotNone(p.signed_url_expires_at)
        self.assertEqual(ports.headers, {"Sheepfold-Preview-Token": "sfp_fake"})
        self.assertIsNone(ports.get(9000))

        self.assertEqual(sb.get_preview_url(8000), f"{self.server.url}/v1/sandboxes/{sb.sandbox_id}/proxy/8000/")
        self.assertTrue(sb.get_preview_url(8000, signed=True).endswith("/proxy/8000/?sf_preview=123.abc"))
        # A port that does not listen: the path form, and no signed URL.
        self.assertEqual(sb.get_preview_url(9000), f"{self.server.url}/v1/sandboxes/{sb.sandbox_id}/proxy/9000/")
        with self.assertRaises(NotFoundError):
            sb.get_preview_url(9000, signed=True)
        for bad in (0, 70000, True, "8000"):
            with self.assertRaises(ValueError):
                sb.get_preview_url(bad)  # type: ignore[arg-type]

        pub = sb.set_port_public(9000)
        self.assertTrue(pub.public and not pub.listening)
        self.assertEqual(self.server.calls("PUT", r".*/ports/9000$")[-1].json(), {"public": True})
        self.assertTrue(sb.list_ports().get(9000).public)
        self.assertTrue(sb.get_preview_url(9000, signed=True))
        self.assertFalse(sb.set_port_public(9000, False).public)
        self.assertIsNone(sb.list_ports().get(9000))
        with self.assertRaises(InvalidArgumentError):
            sb.set_port_public(70000)
        with self.assertRaises(TypeError):
            sb.set_port_public("80")  # type: ignore[arg-type]


class TestErrors(FakeServerTest):
    def test_bad_key_is_authentication_error(self) -> None:
        with self.assertRaises(AuthenticationError) as cm:
            Sandbox.create(api_key="nope")
        e = cm.exception
        self.assertEqual((e.code, e.status, e.request_id), ("ERR_AUTHENTICATION_FAILED", 401, "req_fake"))
        self.assertIn("ERR_AUTHENTICATION_FAILED", str(e))
        self.assertIsInstance(e, SheepfoldError)

    def test_missing_key_sends_no_auth_header(self) -> None:
        with mock.patch.dict(os.environ, {"SHEEPFOLD_API_KEY": ""}):
            with self.assertRaises(AuthenticationError):
                Sandbox.list()
        self.assertNotIn("Authorization", self.server.requests[-1].headers)

    def test_mapping_by_code(self) -> None:
        cases = [
            ("ERR_BAD_REQUEST", 400, InvalidArgumentError),
            ("ERR_UNSUPPORTED_LANGUAGE", 400, UnsupportedLanguageError),
            ("ERR_NOT_FOUND", 404, NotFoundError),
            ("ERR_SANDBOX_NOT_FOUND", 404, SandboxNotFoundError),
            ("ERR_TEMPLATE_NOT_FOUND", 404, TemplateNotFoundError),
            ("ERR_SANDBOX_STATE", 409, SandboxStateError),
            ("ERR_SANDBOX_TIMEOUT", 408, SandboxTimeoutError),
            ("ERR_FILE_TOO_LARGE", 413, FileTooLargeError),
            ("ERR_RATE_LIMITED", 429, RateLimitError),
            ("ERR_NETWORK_RESTRICTED", 403, NetworkRestrictedError),
            ("ERR_CAPACITY", 503, sheepfold.CapacityError),
            ("ERR_INTERNAL", 500, sheepfold.InternalServerError),
        ]
        for code, status, cls in cases:
            e = error_for(code, "m", status, "r")
            self.assertIs(type(e), cls, code)
            self.assertEqual(e.code, code)
        self.assertIsInstance(error_for("ERR_SANDBOX_TIMEOUT", "m"), TimeoutError)
        self.assertIsInstance(error_for("ERR_BAD_REQUEST", "m"), ValueError)
        # Unknown codes keep their string; the status picks the class.
        e = error_for("ERR_BRAND_NEW", "m", 404)
        self.assertIsInstance(e, NotFoundError)
        self.assertEqual(e.code, "ERR_BRAND_NEW")
        self.assertIs(type(error_for("ERR_WHAT", "m", 418)), SheepfoldError)
        self.assertIsInstance(error_for(None, "m", 502), sheepfold.InternalServerError)

    def test_server_errors_are_raised_with_code(self) -> None:
        with self.assertRaises(TemplateNotFoundError) as cm:
            Sandbox.create(template="nope")
        self.assertIsInstance(cm.exception, NotFoundError)
        with self.assertRaises(NetworkRestrictedError) as cm2:
            Sandbox.create(sandbox_config={"network_restricted": False})
        self.assertEqual(cm2.exception.status, 403)

    def test_non_json_error_body(self) -> None:
        self.server.inject(502, b"<html>bad gateway</html>")
        with self.assertRaises(sheepfold.InternalServerError) as cm:
            Sandbox.list()
        self.assertEqual(cm.exception.status, 502)
        self.assertEqual(cm.exception.code, "ERR_INTERNAL")
        self.assertIn("bad gateway", cm.exception.message)

    def test_connection_refused(self) -> None:
        with self.assertRaises(SheepfoldConnectionError) as cm:
            Sandbox.create(base_url="http://127.0.0.1:1")
        self.assertEqual(cm.exception.code, "ERR_CONNECTION")
        self.assertIsInstance(cm.exception, ConnectionError)

    def test_bad_base_url(self) -> None:
        with self.assertRaises(ValueError):
            Sandbox.create(base_url="ftp://x")


class TestRetries(FakeServerTest):
    RATE = {"error": {"code": "ERR_RATE_LIMITED", "message": "slow down", "request_id": "req_429"}}

    def test_429_is_retried_then_succeeds(self) -> None:
        self.server.inject(429, self.RATE, {"Retry-After": "0"}, times=2)
        sb = Sandbox.create(template="python")
        self.assertEqual(sb.sandbox_id, "sbx_1")
        posts = self.server.calls("POST", "/v1/sandboxes")
        self.assertEqual(len(posts), 3)
        self.assertTrue(all(p.json() == {"template": "python"} for p in posts))
        self.assertEqual(len({p.headers["X-Request-Id"] for p in posts}), 3)
        sb.kill()

    def test_429_gives_up_after_3_retries(self) -> None:
        self.server.inject(429, self.RATE, {"Retry-After": "0"}, times=4)
        with self.assertRaises(RateLimitError) as cm:
            Sandbox.list()
        self.assertEqual(len(self.server.calls("GET", "/v1/sandboxes")), 4)
        self.assertEqual(cm.exception.code, "ERR_RATE_LIMITED")
        self.assertEqual(cm.exception.retry_after, 0)
        self.assertEqual(cm.exception.request_id, "req_429")

    def test_retry_waits_retry_after(self) -> None:
        slept = []
        client = HTTPClient(api_key=API_KEY, base_url=self.server.url, sleep=slept.append)
        self.server.inject(429, self.RATE, {"Retry-After": "2"})
        self.server.inject(429, self.RATE)  # no Retry-After: exponential backoff
        self.server.inject(503, {"error": {"code": "ERR_CAPACITY", "message": "full", "request_id": "r"}},
                           {"Retry-After": "1"})
        self.assertEqual(client.get_json("/v1/sandboxes"), {"sandboxes": []})
        self.assertEqual(slept, [2.0, 1.0, 1.0])

    def test_503_without_retry_after_and_other_errors_are_not_retried(self) -> None:
        self.server.inject(503, {"error": {"code": "ERR_CAPACITY", "message": "full", "request_id": "r"}})
        with self.assertRaises(sheepfold.CapacityError):
            Sandbox.list()
        self.server.inject(500, {"error": {"code": "ERR_INTERNAL", "message": "x", "request_id": "r"}})
        with self.assertRaises(sheepfold.InternalServerError):
            Sandbox.list()
        self.assertEqual(len(self.server.calls("GET", "/v1/sandboxes")), 2)

    def test_base_url_path_prefix_and_query(self) -> None:
        c = HTTPClient(api_key="k", base_url="https://example.com/sheepfold/")
        self.assertEqual(c.url("/v1/sandboxes", {"state": None}), "/sheepfold/v1/sandboxes")
        self.assertEqual(c.url("/v1/x", {"path": "a b&c", "depth": 2, "flag": True}),
                         "/sheepfold/v1/x?path=a+b%26c&depth=2&flag=true")

    def test_parse_retry_after(self) -> None:
        self.assertEqual(parse_retry_after("3"), 3.0)
        self.assertIsNone(parse_retry_after(None))
        self.assertIsNone(parse_retry_after("soon"))
        future = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
        self.assertTrue(25 <= parse_retry_after(future) <= 31)
        self.assertEqual(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), 0.0)


class TestRunCode(FakeServerTest):
    def test_plain_json_execution(self) -> None:
        sb = self.sandbox()
        ex = sb.run_code("out:hello\nerr:warn\npng\nresult:42", language="python", timeout=30,
                         envs={"X": "1"})
        req = self.server.calls("POST", r".*/execute")[0]
        self.assertEqual(req.json(), {"code": "out:hello\nerr:warn\npng\nresult:42", "language": "python",
                                      "timeout_ms": 30000, "env": {"X": "1"}})
        self.assertIsNone(req.q("stream"))
        self.assertEqual(req.headers["Accept"], "application/json")
        self.assertIsInstance(ex, Execution)
        self.assertEqual(ex.logs.stdout, ["hello"])
        self.assertEqual(ex.logs.stderr, ["warn"])
        self.assertEqual(ex.text, "42")
        self.assertEqual(len(ex.results), 2)
        self.assertEqual(ex.results[0].png, PNG)
        self.assertEqual(ex.results[0].png_bytes(), base64.b64decode(PNG))
        self.assertEqual(ex.results[0].formats(), ["text", "png"])
        self.assertFalse(ex.results[0].is_main_result)
        self.assertTrue(ex.results[1].is_main_result)
        self.assertIsNone(ex.error)
        self.assertIsNone(ex.error_code)
        self.assertEqual(ex.status, "success")
        self.assertEqual(ex.execution_time_ms, 12.5)
        self.assertEqual(ex.cpu_time_ms, 10.25)
        self.assertEqual(ex.peak_memory_bytes, 1048576)

    def test_execution_error_and_timeout(self) -> None:
        sb = self.sandbox()
        ex = sb.run_code("raise:ZeroDivisionError:division by zero")
        self.assertEqual(ex.status, "error")
        self.assertIsInstance(ex.error, ExecutionError)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertEqual(ex.error.value, "division by zero")
        self.assertIn("Traceback", ex.error.traceback)
        self.assertIsNone(ex.text)
        ex = sb.run_code("timeout")
        self.assertEqual((ex.status, ex.error_code), ("timeout", "ERR_SANDBOX_TIMEOUT"))
        self.assertEqual(self.server.calls("POST", r".*/execute")[0].json(),
                         {"code": "raise:ZeroDivisionError:division by zero"})

    def test_streaming_callbacks_in_order(self) -> None:
        sb = self.sandbox()
        seen = []
        ex = sb.run_code("out:a\nerr:b\nout:c\npng\nresult:42\nraise:ValueError:bad",
                         on_stdout=lambda s: seen.append(("stdout", s)),
                         on_stderr=lambda s: seen.append(("stderr", s)),
                         on_result=lambda r: seen.append(("result", r.text)),
                         on_error=lambda e: seen.append(("error", e.name)))
        req = self.server.calls("POST", r".*/execute")[0]
        self.assertEqual(req.q("stream"), "1")
        self.assertEqual(req.headers["Accept"], "application/x-ndjson")
        self.assertEqual(seen, [("stdout", "a"), ("stderr", "b"), ("stdout", "c"),
                                ("result", "<Figure size 640x480 with 1 Axes>"), ("result", "42"),
                                ("error", "ValueError")])
        self.assertEqual(ex.logs.stdout, ["a", "c"])
        self.assertEqual(ex.logs.stderr, ["b"])
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.error.value, "bad")
        self.assertEqual(ex.status, "error")
        self.assertEqual(ex.peak_memory_bytes, 1048576)

    def test_only_one_callback_streams_too(self) -> None:
        sb = self.sandbox()
        got = []
        ex = sb.run_code("out:x\nresult:1", on_result=got.append)
        self.assertEqual([r.text for r in got], ["1"])
        self.assertEqual(ex.logs.stdout, ["x"])
        self.assertEqual(self.server.calls("POST", r".*/execute")[0].q("stream"), "1")

    def test_streaming_is_live(self) -> None:
        """Callbacks run as lines arrive, not after the response ends: the
        fake server holds the stream open until the first callback fired."""
        sb = self.sandbox()
        order = []

        def on_stdout(text: str) -> None:
            order.append(text)
            if text == "first":
                self.server.gate.set()

        ex = sb.run_code("out:first\nwait\nout:second", on_stdout=on_stdout, timeout=10)
        self.assertTrue(self.server.gate_was_open_in_time)
        self.assertEqual(order, ["first", "second"])
        self.assertEqual(ex.stdout, "firstsecond")

    def test_mid_stream_failure_raises(self) -> None:
        sb = self.sandbox()
        out = []
        with self.assertRaises(SandboxStateError) as cm:
            sb.run_code("out:x\nfailure", on_stdout=out.append)
        self.assertEqual(out, ["x"])
        self.assertEqual(cm.exception.code, "ERR_SANDBOX_STATE")
        self.assertIsNone(cm.exception.status)

    def test_callback_exception_propagates(self) -> None:
        sb = self.sandbox()

        def boom(_: str) -> None:
            raise KeyError("from callback")

        with self.assertRaises(KeyError):
            sb.run_code("out:a\nout:b", on_stdout=boom)
        self.assertEqual(sb.run_code("result:ok").text, "ok")

    def test_stream_request_answered_with_plain_json(self) -> None:
        sb = self.sandbox()
        self.server.inject(200, {"status": "success", "stdout": "hi", "stderr": "", "results": [
            {"text": "1", "is_main_result": True}], "execution_time_ms": 1})
        got = []
        ex = sb.run_code("whatever", on_stdout=got.append)
        self.assertEqual((ex.text, ex.logs.stdout, got), ("1", ["hi"], []))

    def test_stream_without_done_is_a_protocol_error(self) -> None:
        sb = self.sandbox()
        self.server.inject(200, b'{"type":"stdout","text":"a"}\n', {"Content-Type": "application/x-ndjson"})
        with self.assertRaises(SheepfoldError) as cm:
            sb.run_code("x", on_stdout=lambda s: None)
        self.assertEqual(cm.exception.code, "ERR_PROTOCOL")

    def test_unsupported_language(self) -> None:
        sb = self.sandbox()
        with self.assertRaises(UnsupportedLanguageError) as cm:
            sb.run_code("1", language="cobol")
        self.assertEqual(cm.exception.code, "ERR_UNSUPPORTED_LANGUAGE")
        with self.assertRaises(UnsupportedLanguageError):
            sb.run_code("1", language="cobol", on_stdout=print)

    def test_request_timeout_raises_connection_error(self) -> None:
        sb = self.sandbox()
        with self.assertRaises(SheepfoldConnectionError):
            sb.run_code("sleep:1", request_timeout=0.2)


class TestContexts(FakeServerTest):
    def test_context_lifecycle(self) -> None:
        sb = self.sandbox()
        ctx = sb.create_code_context(language="python", cwd="/tmp")
        self.assertIsInstance(ctx, CodeContext)
        self.assertEqual(self.server.calls("POST", r".*/contexts")[0].json(), {"language": "python", "cwd": "/tmp"})
        self.assertEqual((ctx.language, ctx.cwd), ("python", "/tmp"))
        self.assertEqual([c.id for c in sb.list_code_contexts()], [ctx.id])
        sb.run_code("result:1", context=ctx)
        sb.run_code("result:1", context=ctx.id)
        for req in self.server.calls("POST", r".*/execute"):
            self.assertEqual(req.json()["context_id"], ctx.id)
            self.assertNotIn("language", req.json())
        self.assertEqual(sb.restart_code_context(ctx).id, ctx.id)
        self.assertEqual(len(self.server.calls("POST", rf".*/contexts/{ctx.id}/restart")), 1)
        sb.remove_code_context(ctx)
        self.assertEqual(sb.list_code_contexts(), [])
        with self.assertRaises(NotFoundError):
            sb.remove_code_context(ctx.id)


class TestCommands(FakeServerTest):
    def test_run_foreground(self) -> None:
        sb = self.sandbox()
        r = sb.commands.run("echo hi; warn careful; exit 2", envs={"A": "b"}, cwd="/tmp", timeout=5)
        req = self.server.calls("POST", r".*/commands")[0]
        self.assertEqual(req.json(), {"cmd": "/bin/bash", "args": ["-c", "echo hi; warn careful; exit 2"],
                                      "env": {"A": "b"}, "cwd": "/tmp", "timeout_ms": 5000})
        self.assertIsInstance(r, CommandResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("hi\n", "careful\n", 2))
        self.assertEqual(r.error, "careful\n")
        self.assertEqual(r.status, "exited")
        self.assertGreater(r.pid, 0)

    def test_run_default_timeout_is_60s(self) -> None:
        sb = self.sandbox()
        sb.commands.run("echo x")
        self.assertEqual(self.server.calls("POST", r".*/commands")[0].json()["timeout_ms"], 60000)

    def test_run_streaming(self) -> None:
        sb = self.sandbox()
        seen = []
        r = sb.commands.run("echo a; echo b; warn c", on_stdout=lambda s: seen.append(("o", s)),
                            on_stderr=lambda s: seen.append(("e", s)))
        req = self.server.calls("POST", r".*/commands")[0]
        self.assertEqual(req.q("stream"), "1")
        self.assertEqual(seen, [("o", "a\n"), ("o", "b\n"), ("e", "c\n")])
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("a\nb\n", "c\n", 0))

    def test_background_timeout_only_when_asked(self) -> None:
        sb = self.sandbox()
        sb.commands.run("sleep 100", background=True, timeout=5)
        self.assertEqual(self.server.calls("POST", r".*/commands")[0].json()["timeout_ms"], 5000)

    def test_background_handle(self) -> None:
        sb = self.sandbox()
        h = sb.commands.run("sleep 100", background=True, stdin=True)
        self.assertIsInstance(h, CommandHandle)
        req = self.server.calls("POST", r".*/commands")[0]
        # A background command lives as long as its sandbox unless it
        # asks for a timeout.
        self.assertEqual(req.json(), {"cmd": "/bin/bash", "args": ["-c", "sleep 100"],
                                      "background": True, "stdin": True})
        procs = sb.commands.list()
        self.assertEqual([p.pid for p in procs], [h.pid])
        self.assertEqual(procs[0].cmd, "/bin/bash")
        self.assertEqual(procs[0].args, ["-c", "sleep 100"])
        self.assertIsNotNone(procs[0].started)
        h.send_stdin("hello\n")
        h.send_stdin(b"\x00\x01", eof=True)
        sb.commands.send_stdin(h.pid, "x")
        h.close_stdin()
        self.assertEqual(self.server.stdin, [
            (h.pid, {"data": "hello\n"}),
            (h.pid, {"data_base64": "AAE=", "eof": True}),
            (h.pid, {"data": "x"}),
            (h.pid, {"data": "", "eof": True})])
        self.assertTrue(h.kill())
        self.assertEqual(self.server.signals, [(h.pid, "SIGKILL")])
        self.assertFalse(h.kill())
        self.assertFalse(sb.commands.kill(9999, "SIGTERM"))

    def test_background_wait_streams(self) -> None:
        sb = self.sandbox()
        h = sb.commands.run("loop", background=True)
        out = []
        r = h.wait(on_stdout=out.append)
        req = self.server.calls("GET", rf".*/commands/{h.pid}/stream")[0]
        self.assertEqual(req.q("stream"), "1")
        self.assertEqual(req.headers["Accept"], "application/x-ndjson")
        self.assertEqual(out, ["tick 1\n", "tick 2\n"])
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.pid), (3, "tick 1\ntick 2\n", "oops\n", h.pid))

    def test_kill_with_signal_number(self) -> None:
        sb = self.sandbox()
        h = sb.commands.run("x", background=True)
        self.assertTrue(sb.commands.kill(h.pid, 15))
        self.assertEqual(self.server.signals, [(h.pid, 15)])


class TestFiles(FakeServerTest):
    def test_write_read_str_and_bytes(self) -> None:
        sb = self.sandbox()
        info = sb.files.write("orders.csv", "id,country\n1,DE\n")
        req = self.server.calls("PUT", r".*/files")[0]
        self.assertEqual(req.q("path"), "orders.csv")
        self.assertEqual(req.body, b"id,country\n1,DE\n")
        self.assertEqual(req.headers["Content-Type"], "application/octet-stream")
        self.assertIsInstance(info, FileInfo)
        self.assertEqual((info.path, info.name, info.size, info.type), ("/home/user/orders.csv", "orders.csv", 16, "file"))
        self.assertEqual(info.mode, 0o644)
        self.assertIsNotNone(info.mod_time)
        self.assertEqual(sb.files.read("orders.csv"), "id,country\n1,DE\n")
        sb.files.write("/tmp/b.bin", b"\x00\xff", mode=0o755)
        self.assertEqual(self.server.calls("PUT", r".*/files")[1].q("mode"), "0755")
        self.assertEqual(sb.files.read("/tmp/b.bin", format="bytes"), b"\x00\xff")
        with self.assertRaises(ValueError):
            sb.files.read("x", format="blob")

    def test_unicode_and_query_escaping(self) -> None:
        sb = self.sandbox()
        sb.files.write("dir with space/ü&x=1.txt", "grüße")
        self.assertEqual(self.server.calls("PUT", r".*/files")[0].q("path"), "dir with space/ü&x=1.txt")
        self.assertEqual(sb.files.read("dir with space/ü&x=1.txt"), "grüße")

    def test_write_files_multipart(self) -> None:
        sb = self.sandbox()
        infos = sb.files.write_files([
            sheepfold.WriteEntry("a.txt", "A"),
            {"path": "data/b.bin", "data": b"\x00B\r\n--x"},
            ("data/c\"q.txt", "C"),
        ])
        posts = self.server.calls("POST", r".*/files")
        self.assertEqual(len(posts), 2)  # one per directory
        self.assertIsNone(posts[0].q("path"))
        self.assertEqual(posts[1].q("path"), "data")
        self.assertTrue(posts[0].headers["Content-Type"].startswith("multipart/form-data; boundary="))
        self.assertEqual([i.path for i in infos],
                         ["/home/user/a.txt", "/home/user/data/b.bin", "/home/user/data/c%22q.txt"])
        self.assertEqual(self.server.files[sb.sandbox_id]["/home/user/data/b.bin"], b"\x00B\r\n--x")
        self.assertEqual(self.server.files[sb.sandbox_id]["/home/user/a.txt"], b"A")

    def test_list_stat_exists_mkdir_rename_remove(self) -> None:
        sb = self.sandbox()
        sb.files.write("a.txt", "A")
        d = sb.files.make_dir("sub")
        self.assertEqual(self.server.calls("POST", r".*/files/mkdir")[0].json(), {"path": "sub"})
        self.assertTrue(d.is_dir)
        entries = sb.files.list("/home/user")
        self.assertEqual(sorted((e.name, e.type) for e in entries), [("a.txt", "file"), ("sub", "dir")])
        req = self.server.calls("GET", r".*/files/list")[0]
        self.assertEqual((req.q("path"), req.q("depth")), ("/home/user", "1"))
        sb.files.list("/home/user", depth=3)
        self.assertEqual(self.server.calls("GET", r".*/files/list")[1].q("depth"), "3")
        # Listings page: list follows the cursors, list_page gives one page.
        for i in range(5):
            sb.files.write(f"many/{i}", "")
        self.assertEqual([e.name for e in sb.files.list("many")], ["0", "1", "2", "3", "4"])
        lists = self.server.calls("GET", r".*/files/list")[2:]
        self.assertEqual([c.q("cursor") for c in lists], [None, "/home/user/many/2"])
        page = sb.files.list_page("many", limit=4)
        self.assertEqual(([e.name for e in page.entries], page.next_cursor), (["0", "1", "2", "3"], "/home/user/many/3"))
        page = sb.files.list_page("many", limit=4, cursor=page.next_cursor)
        self.assertEqual(([e.name for e in page.entries], page.next_cursor), (["4"], None))
        with self.assertRaises(SheepfoldError) as cm:
            sb.files.list_page("/home/user", cursor="/etc/x")
        self.assertEqual(cm.exception.code, "ERR_BAD_REQUEST")
        self.assertTrue(sb.files.exists("a.txt"))
        self.assertFalse(sb.files.exists("nope.txt"))
        self.assertEqual(sb.files.get_info("a.txt").size, 1)
        moved = sb.files.rename("a.txt", "sub/b.txt")
        self.assertEqual(self.server.calls("POST", r".*/files/move")[0].json(), {"from": "a.txt", "to": "sub/b.txt"})
        self.assertEqual(moved.path, "/home/user/sub/b.txt")
        sb.files.remove("sub/b.txt")
        self.assertEqual(self.server.calls("DELETE", r".*/files")[0].q("path"), "sub/b.txt")
        self.assertFalse(sb.files.exists("sub/b.txt"))
        with self.assertRaises(NotFoundError) as cm:
            sb.files.read("sub/b.txt")
        self.assertEqual(cm.exception.code, "ERR_NOT_FOUND")

    def test_exists_on_dead_sandbox_raises(self) -> None:
        sb = Sandbox.create()
        sb.kill()
        with self.assertRaises(SandboxStateError):
            sb.files.exists("a.txt")
        ghost = Sandbox(sheepfold.SandboxInfo(sandbox_id="sbx_unknown"), sb._http)
        with self.assertRaises(SandboxNotFoundError):
            ghost.files.exists("a.txt")

    def test_file_too_large(self) -> None:
        sb = self.sandbox()
        with self.assertRaises(FileTooLargeError) as cm:
            sb.files.write("big.bin", b"x" * 2000)
        self.assertEqual((cm.exception.code, cm.exception.status), ("ERR_FILE_TOO_LARGE", 413))

    def test_upload_download_local_files(self) -> None:
        import tempfile
        sb = self.sandbox()
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "in.txt")
            with open(src, "wb") as f:
                f.write(b"local")
            sb.files.upload(src)
            dst = os.path.join(tmp, "out.txt")
            sb.files.download("in.txt", dst)
            with open(dst, "rb") as f:
                self.assertEqual(f.read(), b"local")


class TestModels(unittest.TestCase):
    def test_parse_time(self) -> None:
        self.assertEqual(parse_time("2026-01-02T03:04:05Z"), datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
        self.assertEqual(parse_time("2026-01-02T03:04:05.123456789+02:00").microsecond, 123456)
        self.assertEqual(parse_time("2026-01-02T03:04:05.1Z").microsecond, 100000)
        self.assertIsNone(parse_time(None))
        self.assertIsNone(parse_time("garbage"))

    def test_result_formats_and_extra(self) -> None:
        r = Result.from_dict({"text": "t", "html": "<b>", "json": {"a": 1}, "extra": {"application/x-y": "z"}})
        self.assertEqual(r.formats(), ["text", "html", "json", "application/x-y"])
        self.assertEqual(r["json"], {"a": 1})
        self.assertEqual(r["application/x-y"], "z")
        self.assertEqual(str(r), "t")
        self.assertEqual(r._repr_html_(), "<b>")
        with self.assertRaises(KeyError):
            r["nothing"]

    def test_execution_from_minimal_dict(self) -> None:
        ex = Execution.from_dict({"status": "success", "stdout": "", "results": []})
        self.assertEqual((ex.logs.stdout, ex.logs.stderr, ex.text, ex.error), ([], [], None, None))

    def test_public_api(self) -> None:
        for name in sheepfold.__all__:
            self.assertTrue(hasattr(sheepfold, name), name)


if __name__ == "__main__":
    unittest.main()
