"""End-to-end tests of the SDK against a real Sheepfold server.

These are skipped unless both environment variables are set:

    SHEEPFOLD_E2E_URL   the server's base URL, e.g. http://127.0.0.1:8080
    SHEEPFOLD_E2E_KEY   an API key for it

CI (the integration suite) runs this module with the variables set against a
server it started, using the default "python" template (pandas, matplotlib):

    SHEEPFOLD_E2E_URL=... SHEEPFOLD_E2E_KEY=... \\
        /usr/bin/python3 -m unittest discover -s sdk/python/tests -p 'test_e2e.py' -v
"""

from __future__ import annotations

import base64
import http.server
import os
import queue
import sys
import threading
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from sheepfold import (  # noqa: E402
    Account,
    Admin,
    AuthenticationError,
    Client,
    CommandHandle,
    ModuleBlockedError,
    NetworkRestrictedError,
    SandboxTimeoutError,
    SessionQuotaExceededError,
    PermissionDeniedError,
    RateLimitError,
    Events,
    InvalidArgumentError,
    InvalidPolicyError,
    NotFoundError,
    Sandbox,
    SandboxNotFoundError,
    SandboxStateError,
    Webhooks,
    verify_webhook,
)

E2E_URL = os.environ.get("SHEEPFOLD_E2E_URL")
E2E_KEY = os.environ.get("SHEEPFOLD_E2E_KEY")
E2E_ADMIN_KEY = os.environ.get("SHEEPFOLD_E2E_ADMIN_KEY")  # for the accounts test
TEMPLATE = os.environ.get("SHEEPFOLD_E2E_TEMPLATE", "python")

ORDERS = "id,country,amount\n1,DE,10\n2,FR,20\n3,DE,5\n4,US,7.5\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@unittest.skipUnless(E2E_URL and E2E_KEY, "set SHEEPFOLD_E2E_URL and SHEEPFOLD_E2E_KEY to run the end-to-end tests")
class TestEndToEnd(unittest.TestCase):
    def create(self) -> Sandbox:
        sb = Sandbox.create(template=TEMPLATE, timeout=300, metadata={"suite": "sdk-python-e2e"},
                            api_key=E2E_KEY, base_url=E2E_URL)
        self.addCleanup(sb.kill)
        return sb

    def test_data_analysis_session(self) -> None:
        sb = self.create()
        self.assertTrue(sb.is_running())
        self.assertIn(sb.sandbox_id, [s.sandbox_id for s in Sandbox.list(api_key=E2E_KEY, base_url=E2E_URL)])

        # Upload, then two executions that share the interpreter's state.
        info = sb.files.write("orders.csv", ORDERS)
        self.assertEqual(info.size, len(ORDERS))
        self.assertEqual(info.path, "/home/user/orders.csv")
        ex = sb.run_code("import pandas as pd\ndf = pd.read_csv('orders.csv')\nprint(len(df))\n"
                         "df.groupby('country')['amount'].sum()", language="python", timeout=60)
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        self.assertEqual(ex.status, "success")
        self.assertEqual("".join(ex.logs.stdout).strip(), "4")
        self.assertIn("DE", ex.text or "")
        self.assertIn("15", ex.text or "")

        chunks = []
        ex = sb.run_code("total = float(df['amount'].sum())\nprint('total', total)\ntotal",
                         on_stdout=chunks.append, timeout=60)
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        self.assertEqual(ex.text, "42.5")
        self.assertIn("total 42.5", "".join(chunks))
        self.assertGreater(ex.execution_time_ms, 0)

        # A chart comes back as a PNG result, and the file it saved downloads.
        ex = sb.run_code(
            "import matplotlib.pyplot as plt\n"
            "by = df.groupby('country')['amount'].sum()\n"
            "fig, ax = plt.subplots()\n"
            "ax.bar(by.index, by.values)\n"
            "fig.savefig('chart.png')\n"
            "plt.show()\n", timeout=60)
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        pngs = [r for r in ex.results if r.png]
        self.assertTrue(pngs, f"no PNG result in {ex.results!r}")
        self.assertTrue(base64.b64decode(pngs[0].png).startswith(PNG_MAGIC))
        data = sb.files.read("chart.png", format="bytes")
        self.assertTrue(data.startswith(PNG_MAGIC))

        # An exception in the code is data, not an SDK error.
        ex = sb.run_code("1/0")
        self.assertEqual(ex.status, "error")
        self.assertEqual(ex.error.name, "ZeroDivisionError")

        # Files API round trip.
        self.assertIn("orders.csv", [e.name for e in sb.files.list("/home/user")])
        self.assertTrue(sb.files.exists("chart.png"))
        sb.files.remove("chart.png")
        self.assertFalse(sb.files.exists("chart.png"))
        with self.assertRaises(NotFoundError):
            sb.files.read("chart.png")

        # Commands.
        r = sb.commands.run("wc -l < orders.csv; echo oops >&2; exit 3", timeout=30)
        self.assertEqual(r.stdout.strip(), "5")
        self.assertEqual(r.stderr.strip(), "oops")
        self.assertEqual(r.exit_code, 3)
        h = sb.commands.run("sleep 60", background=True)
        self.assertIsInstance(h, CommandHandle)
        self.assertIn(h.pid, [p.pid for p in sb.commands.list()])
        self.assertTrue(h.kill())

        # Kill: the sandbox is gone.
        sid = sb.sandbox_id
        self.assertTrue(sb.kill())
        self.assertFalse(sb.is_running())
        self.assertEqual(sb.get_info().state, "stopped")
        with self.assertRaises(SandboxStateError):
            sb.run_code("1")
        self.assertNotIn(sid, [s.sandbox_id for s in Sandbox.list(api_key=E2E_KEY, base_url=E2E_URL)])

    def test_events_and_webhooks(self) -> None:
        # A receiver on loopback, as a real one would be on the network.
        got: "queue.Queue[tuple]" = queue.Queue()

        class Receiver(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.put((self.headers["Sheepfold-Timestamp"], self.headers["Sheepfold-Signature"], body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        rx = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=rx.serve_forever, daemon=True).start()
        self.addCleanup(rx.shutdown)
        hooks = Webhooks(api_key=E2E_KEY, base_url=E2E_URL)
        hook = hooks.create(f"http://127.0.0.1:{rx.server_address[1]}/hook", types=["sandbox.stopped"])
        self.addCleanup(lambda: hooks.delete(hook.id))
        self.assertTrue(hook.secret)
        self.assertIn(hook.id, [h.id for h in hooks.list()])
        self.assertTrue(all(h.secret is None for h in hooks.list()))
        with self.assertRaises(InvalidArgumentError):
            hooks.create("http://169.254.169.254/latest/meta-data/")

        sb = self.create()
        sb.run_code("1 + 1")
        sb.kill()
        # The sandbox's stream replays its events and ends at its stop.
        types = [ev.type for ev in sb.events.stream()]
        self.assertEqual(types, ["sandbox.created", "execution.started", "execution.finished", "sandbox.stopped"])
        page = sb.events.list(types=["execution.finished"])
        self.assertEqual(len(page.events), 1)
        self.assertEqual(page.events[0].details["status"], "success")
        first = sb.events.list(limit=2)
        self.assertEqual(len(first.events), 2)
        rest = sb.events.list(cursor=first.next_cursor)
        self.assertEqual([e.type for e in rest.events], ["execution.finished", "sandbox.stopped"])
        self.assertIsNone(rest.next_cursor)
        account = Events(api_key=E2E_KEY, base_url=E2E_URL).list(sandbox_id=sb.sandbox_id, types=["sandbox.created"])
        self.assertEqual([e.sandbox_id for e in account.events], [sb.sandbox_id])

        ts, sig, body = got.get(timeout=30)
        self.assertTrue(verify_webhook(hook.secret, ts, sig, body))
        self.assertFalse(verify_webhook("another secret", ts, sig, body))
        self.assertIn(b'"sandbox.stopped"', body)

    def test_security_policy(self) -> None:
        secret = "s3cr3t-abcdefgh-12345678"
        sb = Sandbox.create(template=TEMPLATE, timeout=300, envs={"API_TOKEN": secret}, api_key=E2E_KEY, base_url=E2E_URL,
                            security_policy={"access_control": {"blocked_modules": ["socket"]},
                                             "output_filtering": {"strip_sensitive_data": True},
                                             "resource_limits": {"cpu_time_seconds": 5}})
        self.addCleanup(sb.kill)
        pol = sb.get_policy()
        self.assertEqual(pol.policy["access_control"], {"blocked_modules": ["socket"]})
        self.assertEqual(pol.policy["resource_limits"], {"cpu_time_seconds": 5})

        ex = sb.run_code("import socket")
        self.assertEqual(ex.error.name, "ModuleBlockedError")
        self.assertEqual(ex.error_code, "ERR_MODULE_BLOCKED")
        ex = sb.run_code("import os\nprint('tok', os.environ['API_TOKEN'])\n{'token': os.environ['API_TOKEN']}")
        self.assertEqual("".join(ex.logs.stdout), "tok [REDACTED:secret_env]\n")
        self.assertNotIn(secret, str(ex.raw))
        res = sb.commands.run("echo tok $API_TOKEN")
        self.assertEqual(res.stdout, "tok [REDACTED:secret_env]\n")

        # Loosening a rule the interpreter cannot drop needs a restart. A
        # section given replaces the current one ({} clears it), one left
        # out keeps its rules.
        changed = sb.set_policy({"access_control": {}, "resource_limits": {}})
        self.assertTrue(changed.restart_required)
        self.assertIn("access_control.blocked_modules", changed.loosened)
        self.assertEqual(sb.get_policy().policy, {"output_filtering": {"strip_sensitive_data": True}})
        self.assertIsNone(sb.run_code("import socket").error)
        with self.assertRaises(InvalidPolicyError) as cm:
            sb.set_policy({"filesystem": {"readonly": True}})
        self.assertIn("filesystem", str(cm.exception))
        with self.assertRaises(InvalidPolicyError) as cm:
            Sandbox.create(template=TEMPLATE, api_key=E2E_KEY, base_url=E2E_URL,
                           security_policy={"resource_limits": {"cpu_time_seconds": 0}})
        self.assertIn("resource_limits.cpu_time_seconds", str(cm.exception))

        # The events say what happened, listed and streamed.
        violations = sb.events.list(types=["security_violation"]).events
        self.assertEqual([(e.details["kind"], e.details["target"]) for e in violations], [("module_blocked", "socket")])
        self.assertEqual(len(sb.events.list(types=["policy.changed"]).events), 1)
        sb.kill()
        streamed = [e.type for e in sb.events.stream(types=["security_violation", "policy.changed", "sandbox.stopped"])]
        self.assertEqual(streamed, ["security_violation", "policy.changed", "sandbox.stopped"])

    def test_code_context_isolation(self) -> None:
        sb = self.create()
        ctx = sb.create_code_context(language="python")
        sb.run_code("x = 1", context=ctx)
        self.assertEqual(sb.run_code("x", context=ctx).text, "1")
        ex = sb.run_code("x")  # the default context does not see ctx's x
        self.assertEqual(ex.error and ex.error.name, "NameError")
        sb.restart_code_context(ctx)
        self.assertEqual(sb.run_code("x", context=ctx).error.name, "NameError")
        sb.remove_code_context(ctx)

    @unittest.skipUnless(E2E_ADMIN_KEY, "set SHEEPFOLD_E2E_ADMIN_KEY (an admin key) to run the accounts test")
    def test_accounts_usage_credits_alerts(self) -> None:
        admin = Admin(api_key=E2E_ADMIN_KEY, base_url=E2E_URL)
        with self.assertRaises(PermissionDeniedError):
            Admin(api_key=E2E_KEY, base_url=E2E_URL).list_accounts()
        name = "pysdk-" + base64.b32encode(os.urandom(5)).decode().lower()
        acct = admin.create_account(name, limits={"max_sandboxes": 1})
        self.assertEqual(acct["limits"]["max_sandboxes"], 1)
        with self.assertRaises(Exception) as bad:
            admin.set_limits(name, max_cpus=-1)
        self.assertIn("max_cpus", str(bad.exception))
        admin.set_limits(name, monthly_executions=1000, reset=["max_sandboxes"])
        self.assertEqual(admin.get_account(name)["overrides"], {"monthly_executions": 1000})
        self.assertEqual(admin.credit(name, "3.50", reason="sdk test").granted_micros, 3_500_000)
        key = admin.create_key(name, name="py")["key"]

        me = Account(api_key=key, base_url=E2E_URL)
        self.assertEqual(me.info()["name"], name)
        sb = Sandbox.create(template=TEMPLATE, timeout=120, api_key=key, base_url=E2E_URL)
        try:
            self.assertEqual(sb.run_code("6 * 7").text, "42")
            live = me.sandbox_usage(sb.sandbox_id)
            self.assertTrue(live["live"])
            self.assertEqual(live["executions"], 1)
        finally:
            sb.kill()
        report = me.usage(group_by="sandbox")
        ids = [g["sandbox_id"] for g in report["groups"]]
        self.assertIn(sb.sandbox_id, ids)
        self.assertGreater(report["total"]["sandbox_seconds"], 0)
        self.assertEqual(me.info()["month"]["usage"]["executions"], 1)
        self.assertEqual(me.credits().granted_micros, 3_500_000)

        alert = me.create_alert("medium", "from the SDK", sandbox_id=sb.sandbox_id)
        self.assertEqual([a.id for a in me.alerts(unacknowledged=True)], [alert.id])
        self.assertTrue(me.ack_alert(alert).acknowledged)
        self.assertEqual(me.alerts(unacknowledged=True), [])
        self.assertTrue(issubclass(RateLimitError, Exception))

    def test_preview_ports(self) -> None:
        import http.cookiejar
        import time
        import urllib.error
        import urllib.request

        sb = self.create()
        sb.files.write("site/index.html", "<h1>hello from the preview</h1>")
        sb.commands.run("python3 -m http.server 8000", cwd="/home/user/site", background=True)
        deadline = time.monotonic() + 60
        while True:
            ports = sb.list_ports(expires_in=600)
            p = ports.get(8000)
            if p is not None and p.listening:
                break
            if time.monotonic() > deadline:
                self.fail(f"port 8000 never listened: {ports}")
            time.sleep(0.2)  # polling: the server starts in the background
        self.assertFalse(p.public)
        self.assertTrue(p.proxy_url.endswith(f"/v1/sandboxes/{sb.sandbox_id}/proxy/8000/"), p.proxy_url)
        self.assertIn("sf_preview=", p.signed_url)
        self.assertIsNotNone(p.signed_url_expires_at)
        self.assertTrue(ports.token)
        self.assertEqual(sb.get_preview_url(8000), p.url or p.proxy_url)
        self.assertEqual(sb.get_preview_url(9), f"{E2E_URL.rstrip('/')}/v1/sandboxes/{sb.sandbox_id}/proxy/9/")
        with self.assertRaises(NotFoundError):
            sb.get_preview_url(9, signed=True)

        def fetch(url: str, headers: dict = {}, opener: object = None) -> tuple:
            req = urllib.request.Request(url, headers=headers)
            try:
                with (opener or urllib.request.build_opener()).open(req, timeout=30) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        # Private: refused without a credential; the token opens it; the
        # signed URL opens it in a client with cookies (it redirects).
        self.assertEqual(fetch(p.proxy_url)[0], 401)
        status, body = fetch(p.proxy_url, ports.headers)
        self.assertEqual((status, "hello from the preview" in body), (200, True), body)
        jar = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        signed = sb.get_preview_url(8000, signed=True)
        self.assertTrue(signed.startswith(p.url or p.proxy_url), signed)
        # The signature is the sandbox's, port's and expiry's, whatever the
        # form: opened on the path form (the host form needs wildcard DNS).
        status, body = fetch(p.proxy_url + "?" + signed.split("?", 1)[1], opener=jar)
        self.assertEqual(status, 200, body)

        # Public, then private again.
        pub = sb.set_port_public(8000)
        self.assertTrue(pub.public)
        self.assertTrue(sb.list_ports().get(8000).public)
        self.assertEqual(fetch(p.proxy_url)[0], 200)
        self.assertFalse(sb.set_port_public(8000, False).public)
        self.assertEqual(fetch(p.proxy_url)[0], 401)
        # A port made public before anything listens on it is listed.
        self.assertTrue(sb.set_port_public(8123).public)
        later = sb.list_ports().get(8123)
        self.assertTrue(later is not None and later.public and not later.listening)
        with self.assertRaises(InvalidArgumentError):
            sb.set_port_public(70000)

    def test_bad_key(self) -> None:
        from sheepfold import AuthenticationError
        with self.assertRaises(AuthenticationError):
            Sandbox.list(api_key="sk_wrong_key", base_url=E2E_URL)

    def test_unknown_sandbox(self) -> None:
        with self.assertRaises(SandboxNotFoundError):
            Sandbox.connect("sbx_does_not_exist", api_key=E2E_KEY, base_url=E2E_URL)


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(E2E_URL and E2E_KEY and E2E_ADMIN_KEY,
                     "set SHEEPFOLD_E2E_URL, SHEEPFOLD_E2E_KEY and SHEEPFOLD_E2E_ADMIN_KEY to run the seed's error cases")
class TestSeed002Errors(unittest.TestCase):
    """Seed 002's five error cases, as the article writes them, give its
    codes and messages through this SDK (the integration suite serves
    claude-sonnet-4.5 with a monthly quota of one token, deepseek-v3.2
    without one)."""

    SANDBOX_CONFIG = {
        "max_execution_time": 30,
        "max_memory_mb": 512,
        "allowed_modules": ["json", "math", "re", "datetime"],
        "network_restricted": True,
        "filesystem_readonly": False,
        "filesystem_paths_whitelist": ["/tmp/sandbox/", "/var/tmp/"],
    }

    def setUp(self) -> None:
        admin = Admin(api_key=E2E_ADMIN_KEY, base_url=E2E_URL)
        name = "seed002-" + base64.b32encode(os.urandom(5)).decode().lower()
        admin.create_account(name)
        self.client = Client(api_key=admin.create_key(name, name="seed")["key"], base_url=E2E_URL + "/v1")

    def session(self, model: str = "deepseek-v3.2", **kw) -> str:
        s = self.client.sessions.create(model=model, **kw)
        self.addCleanup(self.client.sessions.delete, s.id)
        return s.id

    def test_1_authentication(self) -> None:
        client = Client(api_key="votre_cle_incorrecte", base_url=E2E_URL + "/v1")
        with self.assertRaises(AuthenticationError) as cm:
            client.sessions.create(model="claude-sonnet-4.5")
        self.assertEqual((cm.exception.code, cm.exception.message, cm.exception.status),
                         ("ERR_AUTHENTICATION_FAILED", "Authentication failed. Invalid API key", 401))

    def test_2_timeout(self) -> None:
        sid = self.session(sandbox_config=self.SANDBOX_CONFIG)
        result = self.client.sandbox.execute(session_id=sid, code="""

# Code qui boucle infiniment
while True:
    print("Boucle infinie")
""", language="python", timeout_ms=3000)
        self.assertEqual(result.status, "timeout")
        self.assertIsInstance(result.error, SandboxTimeoutError)
        self.assertEqual((result.error.code, result.error.message), ("ERR_SANDBOX_TIMEOUT", "Sandbox execution timeout after 3000ms"))
        self.assertIn("[output truncated at", result.output)
        with self.assertRaises(SandboxTimeoutError):
            result.raise_for_error()

    def test_3_module_blocked(self) -> None:
        sid = self.session(sandbox_config=self.SANDBOX_CONFIG)
        result = self.client.sandbox.execute(session_id=sid, code="""
import os
print(os.listdir('/'))
""", language="python")
        self.assertIsInstance(result.error, ModuleBlockedError)
        self.assertEqual((result.error.code, result.error.message), ("ERR_MODULE_BLOCKED", "Module 'os' is blocked by security policy"))

    def test_4_session_quota(self) -> None:
        sid = self.session(model="claude-sonnet-4.5")
        self.client.sessions.ask(session_id=sid, prompt="SAY: bonjour")  # uses the one token of the month
        with self.assertRaises(SessionQuotaExceededError) as cm:
            self.client.sessions.create(model="claude-sonnet-4.5")
        self.assertEqual((cm.exception.code, cm.exception.message, cm.exception.status),
                         ("ERR_SESSION_QUOTA_EXCEEDED", "Monthly quota exceeded for model claude-sonnet-4.5", 429))
        # The article's way out.
        usage = self.client.account.get_usage()
        self.assertGreater(usage.tokens_used, 0)
        self.session(model="deepseek-v3.2")

    def test_5_network_restricted(self) -> None:
        sid = self.session(sandbox_config={"network_restricted": True})
        sb = Sandbox.connect(sid, api_key=self.client._http.api_key, base_url=E2E_URL)
        for lang, code, target in (
                ("python", "\nimport urllib.request\nresponse = urllib.request.urlopen('https://api.example.com')\n", "api.example.com"),
                ("python", "import socket\nsocket.create_connection(('203.0.113.7', 80), timeout=5)", "203.0.113.7:80"),
                ("javascript", "await require('dns').promises.lookup('api.example.com')", "api.example.com"),
                ("bash", "curl -sS --max-time 5 https://api.example.com", "api.example.com")):
            result = self.client.sandbox.execute(session_id=sid, code=code, language=lang)
            self.assertIsInstance(result.error, NetworkRestrictedError, (lang, code, result))
            self.assertEqual((result.error.code, result.error.message),
                             ("ERR_NETWORK_RESTRICTED", "Network access is restricted in sandbox mode"))
            self.assertEqual(sb.run_code(code, language=lang).error_code, "ERR_NETWORK_RESTRICTED", (lang, code))
            seen = [e.details for e in sb.events.list(types=["security_violation"], limit=1000).events]
            self.assertIn({"kind": "network_denied", "target": target}, [{k: d.get(k) for k in ("kind", "target")} for d in seen])
        # A session with network_restricted False has a network.
        open_sid = self.session(sandbox_config={"network_restricted": False})
        self.assertEqual(Sandbox.connect(open_sid, api_key=self.client._http.api_key, base_url=E2E_URL)
                         .get_policy().policy["network"], {"mode": "public"})
