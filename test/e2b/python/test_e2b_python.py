"""E2B's own Python SDK (vendor/: e2b 2.34.0, e2b_code_interpreter 2.9.1)
against a Sheepfold server: seed 000's flow, then the SDK's main calls.

test/integration (TestE2BPythonSDK) unpacks vendor/ and runs this with

    PYTHONPATH=<unpacked>/e2b-python/site
    E2B_API_URL=E2B_SANDBOX_URL=http://127.0.0.1:PORT  E2B_API_KEY=e2b_...
    HOLYSHEEP_URL=http://127.0.0.1:PORT/v1/chat/completions  HOLYSHEEP_KEY=sf_...

Every test is skipped unless E2B_API_URL is set.
"""

from __future__ import annotations

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ORDERS = (b"order_id,customer,email,country,sku,qty,price,stock\n"
          b"1,Ana,ana@example.com,DE,A,2,10.00,5\n"
          b"2,Bo,bo@example.com,FR,B,1,20.00,30\n"
          b"2,Bo,bo@example.com,FR,B,1,20.00,30\n"
          b"3,Cy,cy@example.com,DE,A,1,5.50,4\n")
# Totals per country, duplicates dropped: DE 2*10 + 5.5, FR 20.
TOTALS = "{'DE': 25.5, 'FR': 20.0}"

ENABLED = bool(os.environ.get("E2B_API_URL"))


@unittest.skipUnless(ENABLED, "set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY to run E2B's Python SDK")
class TestSeed000(unittest.TestCase):
    def test_seed_flow(self) -> None:
        """The article's client: the model (requests, /v1/chat/completions)
        writes the pandas group-by, run_in_e2b runs it in a sandbox of 30 s
        with orders.csv uploaded."""
        import seed000

        code = seed000.llm_generate_code("Charge orders.csv et renvoie le CA total par pays.")
        self.assertIn("groupby", code)
        self.assertNotIn("```", code)
        out = seed000.run_in_e2b(code, ORDERS)
        self.assertEqual(out["stdout"], [TOTALS + "\n"], out)
        self.assertEqual(out["stderr"], [])
        self.assertEqual(seed000.strip_fence("```python\nprint(1)\n```"), "print(1)")

    def test_error_2_reuse(self) -> None:
        """The article's error 2 fix: one sandbox of 30 s for every task,
        then kill."""
        from e2b_code_interpreter import Sandbox

        sb = Sandbox.create(timeout=30)  # secondes
        try:
            info = sb.get_info()
            self.assertLessEqual((info.end_at - info.started_at).total_seconds(), 31)
            sb.files.write("orders.csv", ORDERS)
            tasks = ["import pandas as pd\ndf = pd.read_csv('orders.csv')",
                     "orders = df.drop_duplicates(subset='order_id')",
                     "print((orders.qty * orders.price).groupby(orders.country).sum().round(2).to_dict())"]
            counts = []
            for task in tasks:
                ex = sb.run_code(task)  # pas de cold start répété
                self.assertIsNone(ex.error, ex.error)
                counts.append(ex.execution_count)
            self.assertEqual(ex.logs.stdout, [TOTALS + "\n"])
            # executionCount counts the user's executions only, from the
            # pool or not.
            self.assertEqual(counts, [1, 2, 3])
        finally:
            self.assertTrue(sb.kill())
        self.assertFalse(sb.is_running())


@unittest.skipUnless(ENABLED, "set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY to run E2B's Python SDK")
class TestE2BPythonSDK(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        from e2b_code_interpreter import Sandbox

        cls.sb = Sandbox.create(timeout=300, envs={"SF_GLOBAL": "from-create"}, metadata={"suite": "e2b-python"})

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()

    def test_files(self) -> None:
        fs = self.sb.files
        info = fs.write("/home/user/dir/a.txt", "hello")
        self.assertEqual(info.path, "/home/user/dir/a.txt")
        self.assertEqual(fs.read("/home/user/dir/a.txt"), "hello")
        self.assertEqual(bytes(fs.read("/home/user/dir/a.txt", format="bytes")), b"hello")
        self.assertIn("a.txt", [e.name for e in fs.list("/home/user/dir")])
        self.assertTrue(fs.exists("/home/user/dir/a.txt"))
        fs.rename("/home/user/dir/a.txt", "/home/user/dir/b.txt")
        self.assertFalse(fs.exists("/home/user/dir/a.txt"))
        self.assertTrue(fs.make_dir("/home/user/dir/sub"))
        fs.remove("/home/user/dir/b.txt")
        self.assertFalse(fs.exists("/home/user/dir/b.txt"))

    def test_commands(self) -> None:
        from e2b import CommandExitException

        r = self.sb.commands.run("echo out; echo err >&2; echo $SF_GLOBAL $X", envs={"X": "y"})
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\nfrom-create y\n", "err\n", 0))
        with self.assertRaises(CommandExitException) as cm:
            self.sb.commands.run("exit 3")
        self.assertEqual(cm.exception.exit_code, 3)
        seen = []
        h = self.sb.commands.run("sleep 0.5; echo done", background=True, on_stdout=seen.append)
        self.assertIn(h.pid, [p.pid for p in self.sb.commands.list()])
        self.assertEqual(h.wait().stdout, "done\n")
        h = self.sb.commands.run("sleep 60", background=True)
        self.assertTrue(self.sb.commands.kill(h.pid))

    def test_code_env_and_errors(self) -> None:
        ex = self.sb.run_code("import os\nos.environ['SF_GLOBAL'], os.environ.get('ONE')", envs={"ONE": "1"})
        self.assertEqual(ex.text, "('from-create', '1')")
        ex = self.sb.run_code("1/0")
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("division by zero", ex.error.value)
        out = []
        self.sb.run_code("print('streamed')", on_stdout=lambda m: out.append(m.line))
        self.assertEqual(out, ["streamed\n"])
        ex = self.sb.run_code("console.log(6 * 7)", language="javascript")
        self.assertEqual(ex.logs.stdout, ["42\n"])

    def test_contexts(self) -> None:
        ctx = self.sb.create_code_context(cwd="/tmp")
        self.sb.run_code("x = 'in context'", context=ctx)
        self.assertEqual(self.sb.run_code("import os\nos.getcwd(), x", context=ctx).text, "('/tmp', 'in context')")
        self.assertEqual(self.sb.run_code("'x' in dir()").text, "False")
        self.assertIn(ctx.id, [c.id for c in self.sb.list_code_contexts()])
        self.sb.restart_code_context(ctx)
        self.assertEqual(self.sb.run_code("'x' in dir()", context=ctx).text, "False")
        self.sb.remove_code_context(ctx)
        self.assertNotIn(ctx.id, [c.id for c in self.sb.list_code_contexts()])

    def test_charts_and_dataframes(self) -> None:
        ex = self.sb.run_code("import matplotlib.pyplot as plt\nplt.bar(['DE', 'FR'], [25.5, 20])\nplt.title('CA')\nplt.show()")
        self.assertIsNone(ex.error, ex.error)
        self.assertEqual(len(ex.results), 1)
        self.assertTrue(ex.results[0].png)
        self.assertEqual(ex.results[0].chart.title, "CA")
        ex = self.sb.run_code("import pandas as pd\npd.DataFrame({'country': ['DE', 'FR'], 'total': [25.5, 20.0]})")
        self.assertIn("<table", ex.results[0].html)
        self.assertIn("country", ex.results[0].text)

    def test_async(self) -> None:
        from e2b_code_interpreter import AsyncSandbox

        async def flow() -> None:
            sb = await AsyncSandbox.create(timeout=60)
            try:
                await sb.files.write("/home/user/n.txt", "21")
                ex = await sb.run_code("int(open('/home/user/n.txt').read()) * 2")
                self.assertEqual(ex.text, "42")
                r = await sb.commands.run("echo async")
                self.assertEqual(r.stdout, "async\n")
            finally:
                await sb.kill()

        asyncio.run(flow())


@unittest.skipUnless(ENABLED, "set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY to run E2B's Python SDK")
class TestUpstreamRJava(unittest.TestCase):
    """The R and Java cases of E2B's own code-interpreter tests
    (python/tests/sync/test_default_kernels.py: test_r_kernel,
    test_java_kernel; python/tests/sync/env_vars/test_r.py and
    test_java.py: the sandbox's env, an execution's, and one overriding the
    other), run_code called without a template, as E2B's users do. One
    difference, kept on purpose: Sheepfold streams output as the
    interpreter writes it. E2B's Java kernel sends a println's line end as
    a message of its own (its test checks stdout[0] == "Hello, World!"):
    the Java test here checks the joined stdout. R prints
    `[1] "Hello, World!"` in three writes, which the kernel sends as one
    line, so the R test is upstream's (one message)."""

    @classmethod
    def setUpClass(cls) -> None:
        from e2b_code_interpreter import Sandbox

        cls.sb = Sandbox.create(timeout=300, envs={"TEST_ENV_VAR": "supertest"})

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()

    def test_r_kernel(self) -> None:
        ex = self.sb.run_code('print("Hello, World!")', language="r")
        self.assertEqual(ex.logs.stdout, ['[1] "Hello, World!"\n'])

    def test_java_kernel(self) -> None:
        ex = self.sb.run_code('System.out.println("Hello, World!")', language="java")
        self.assertEqual("".join(ex.logs.stdout), "Hello, World!\n")

    def test_r_env_vars(self) -> None:
        ex = self.sb.run_code("Sys.getenv('TEST_ENV_VAR')", language="r")
        self.assertEqual(ex.results[0].text.strip(), '[1] "supertest"')
        ex = self.sb.run_code("Sys.getenv('FOO')", envs={"FOO": "bar"}, language="r")
        self.assertEqual(ex.results[0].text.strip(), '[1] "bar"')
        ex = self.sb.run_code("Sys.getenv('FOO', unset = 'default')", language="r")
        self.assertEqual(ex.results[0].text.strip(), '[1] "default"')
        ex = self.sb.run_code("Sys.getenv('TEST_ENV_VAR')", language="r", envs={"TEST_ENV_VAR": "overwrite"})
        self.assertEqual(ex.results[0].text.strip(), '[1] "overwrite"')

    def test_java_env_vars(self) -> None:
        ex = self.sb.run_code('System.getProperty("TEST_ENV_VAR")', language="java")
        self.assertEqual(ex.results[0].text.strip(), "supertest")
        ex = self.sb.run_code('System.getProperty("FOO")', envs={"FOO": "bar"}, language="java")
        self.assertEqual(ex.results[0].text.strip(), "bar")
        ex = self.sb.run_code('System.getProperty("FOO", "default")', language="java")
        self.assertEqual(ex.results[0].text.strip(), "default")
        ex = self.sb.run_code('System.getProperty("TEST_ENV_VAR")', language="java", envs={"TEST_ENV_VAR": "overwrite"})
        self.assertEqual(ex.results[0].text.strip(), "overwrite")
        ex = self.sb.run_code('System.getProperty("TEST_ENV_VAR")', language="java")
        self.assertEqual(ex.results[0].text.strip(), "supertest")

    def test_r_java_state_results_errors(self) -> None:
        """Beyond E2B's tests: state, a plot, a data frame, errors and
        streamed output in both."""
        out = []
        self.sb.run_code("y <- 20", language="r")
        ex = self.sb.run_code("cat('streamed\\n'); plot(1:3); data.frame(y = y + 1)", language="r", on_stdout=lambda m: out.append(m.line))
        self.assertEqual(out, ["streamed\n"])
        self.assertTrue(any(r.png for r in ex.results), ex.results)
        self.assertTrue(any(r.html and "<td>21</td>" in r.html for r in ex.results), ex.results)
        ex = self.sb.run_code("stop('bad')", language="r")
        self.assertEqual((ex.error.name, ex.error.value), ("simpleError", "bad"))
        self.sb.run_code("int y = 20;", language="java")
        self.assertEqual(self.sb.run_code("y + 1", language="java").text, "21")
        ex = self.sb.run_code('throw new IllegalArgumentException("bad")', language="java")
        self.assertEqual((ex.error.name, ex.error.value), ("IllegalArgumentException", "bad"))
        self.assertIn("java.lang.IllegalArgumentException: bad", ex.error.traceback)


if __name__ == "__main__":
    unittest.main()
