"""The session client (sheepfold.Client) against a real server whose model is
the scripted provider (internal/llm/llmtest.Brain).

Skipped unless these are set (internal/server's TestPythonSDKSessions sets them):

    SHEEPFOLD_SESSIONS_URL      the server's base URL
    SHEEPFOLD_SESSIONS_KEY      an API key
    SHEEPFOLD_SESSIONS_MODEL    a model with no quota
    SHEEPFOLD_SESSIONS_QUOTA_MODEL  a model whose monthly quota one ask uses up
"""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from sheepfold import (  # noqa: E402
    AuthenticationError,
    Client,
    CodeExecutionError,
    InvalidPolicyError,
    ModelNotFoundError,
    ModuleBlockedError,
    NetworkRestrictedError,
    SandboxTimeoutError,
    SessionNotFoundError,
    SessionQuotaExceededError,
)

URL = os.environ.get("SHEEPFOLD_SESSIONS_URL")
KEY = os.environ.get("SHEEPFOLD_SESSIONS_KEY")
MODEL = os.environ.get("SHEEPFOLD_SESSIONS_MODEL", "")
QUOTA_MODEL = os.environ.get("SHEEPFOLD_SESSIONS_QUOTA_MODEL", "")


@unittest.skipUnless(URL and KEY, "set SHEEPFOLD_SESSIONS_URL and SHEEPFOLD_SESSIONS_KEY")
class TestSessions(unittest.TestCase):
    def setUp(self) -> None:
        # The snippet's shape: base_url ends in /v1.
        self.client = Client(api_key=KEY, base_url=URL + "/v1")

    def session(self, **kw):
        s = self.client.sessions.create(model=kw.pop("model", MODEL), **kw)
        self.addCleanup(self.client.sessions.delete, s.id)
        return s

    def test_execute_and_errors(self) -> None:
        session = self.session(sandbox_config={"allowed_modules": ["json", "time", "socket"], "network_restricted": True})
        self.assertEqual(session.state, "running")
        self.assertEqual(self.client.sessions.get(session.id).model, MODEL)
        r = self.client.sandbox.execute(session_id=session.id, code="print(6*7)", language="python", timeout_ms=30000)
        self.assertEqual((r.output, r.status, r.error), ("42\n", "success", None))
        self.assertGreater(r.execution_time_ms, 0)

        r = self.client.sandbox.execute(session_id=session.id, code="import time\ntime.sleep(10)", timeout_ms=300)
        self.assertEqual(r.status, "timeout")
        self.assertIsInstance(r.error, SandboxTimeoutError)
        self.assertEqual((r.error.code, r.error.message), ("ERR_SANDBOX_TIMEOUT", "Sandbox execution timeout after 300ms"))
        with self.assertRaises(SandboxTimeoutError):
            r.raise_for_error()

        r = self.client.sandbox.execute(session_id=session.id, code="import os")
        self.assertIsInstance(r.error, ModuleBlockedError)
        self.assertEqual((r.status, r.error.code, r.error.message),
                         ("error", "ERR_MODULE_BLOCKED", "Module 'os' is blocked by security policy"))

        r = self.client.sandbox.execute(session_id=session.id,
                                        code="import socket\nsocket.create_connection(('203.0.113.1', 80), timeout=2)")
        self.assertIsInstance(r.error, NetworkRestrictedError)
        self.assertEqual((r.error.code, r.error.message),
                         ("ERR_NETWORK_RESTRICTED", "Network access is restricted in sandbox mode"))

        r = self.client.sandbox.execute(session_id=session.id, code="1/0")
        self.assertIsInstance(r.error, CodeExecutionError)
        self.assertEqual((r.error.name, r.error.message), ("ZeroDivisionError", "division by zero"))

    def test_request_errors(self) -> None:
        with self.assertRaises(AuthenticationError) as cm:
            Client(api_key="sf_" + "0" * 40, base_url=URL + "/v1").sessions.create(model=MODEL)
        self.assertEqual((cm.exception.code, cm.exception.message),
                         ("ERR_AUTHENTICATION_FAILED", "Authentication failed. Invalid API key"))
        with self.assertRaises(ModelNotFoundError):
            self.client.sessions.create(model="no-such-model")
        with self.assertRaises(InvalidPolicyError):
            self.client.sessions.create(model=MODEL, sandbox_config={"no_such_field": 1})
        with self.assertRaises(SessionNotFoundError) as cm:
            self.client.sessions.get("sb_nope")
        self.assertEqual(cm.exception.code, "ERR_SESSION_NOT_FOUND")

    def test_ask(self) -> None:
        session = self.session()
        steps = []
        answer = self.client.sessions.ask(session_id=session.id, prompt="RUN:\nimport csv\nprint(sum(1 for _ in open('orders.csv')) - 1)",
                                          files={"orders.csv": "id,total\n1,10\n2,20\n3,5\n"}, on_step=steps.append)
        self.assertEqual(answer.text, "Result: 3")
        self.assertEqual(answer.stop_reason, "answered")
        self.assertEqual([e.output for e in answer.executions], ["3\n"])
        self.assertEqual([s.type for s in steps], ["model", "execution", "model"])
        self.assertGreater(answer.tokens.total_tokens, 0)
        self.assertGreater(answer.model_time_ms, 0)
        self.assertGreater(answer.sheepfold_time_ms, 0)

        # The seeds' models: fenced code, not a tool call; no stream this time.
        answer = self.client.sessions.ask(session_id=session.id, prompt="FENCE:\nprint('fenced')")
        self.assertEqual((answer.text, answer.executions[0].output), ("Result: fenced", "fenced\n"))

        usage = self.client.account.get_usage()
        self.assertGreaterEqual(usage.tokens_used, answer.tokens.total_tokens)
        self.assertIn(MODEL, [m["model"] for m in usage.models])
        credits = self.client.account.get_credits()
        self.assertGreaterEqual(credits.free_credits, 0)

    @unittest.skipUnless(QUOTA_MODEL, "set SHEEPFOLD_SESSIONS_QUOTA_MODEL")
    def test_quota(self) -> None:
        session = self.session(model=QUOTA_MODEL)
        self.client.sessions.ask(session_id=session.id, prompt="SAY: spend the quota")
        with self.assertRaises(SessionQuotaExceededError) as cm:
            self.client.sessions.ask(session_id=session.id, prompt="SAY: again")
        self.assertEqual((cm.exception.code, cm.exception.message),
                         ("ERR_SESSION_QUOTA_EXCEEDED", f"Monthly quota exceeded for model {QUOTA_MODEL}"))

    def test_policy_monitor_alert(self) -> None:
        session = self.session(sandbox_config={"allowed_modules": ["json"]})
        self.client.sandbox.apply_policy(session_id=session.id, policy={"access_control": {"allowed_imports": ["json", "math"]}})
        self.assertIsNone(self.client.sandbox.execute(session_id=session.id, code="import math").error)
        r = self.client.sandbox.execute(session_id=session.id, code="import subprocess")
        self.assertIsInstance(r.error, ModuleBlockedError)
        monitor = self.client.sandbox.monitor(session_id=session.id)
        seen = []
        for event in monitor.stream():
            seen.append(event.type)
            if event.type == "security_violation":
                self.assertIsNotNone(event.timestamp)
                self.assertEqual(event.details.get("kind"), "module_blocked")
                alert = self.client.alerts.create(severity="high", message="blocked import", session_id=session.id)
                self.assertEqual(alert.session_id, session.id)
                monitor.terminate_session(session_id=session.id)
        self.assertIn("security_violation", seen)
        self.assertEqual(seen[-1], "sandbox.stopped")
        self.assertEqual(self.client.sessions.get(session.id).state, "stopped")


if __name__ == "__main__":
    unittest.main()
