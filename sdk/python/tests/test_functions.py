"""Functions (sheepfold.function): what is shipped, here; .remote and .map
against a real server.

The server tests are skipped unless these are set (internal/server's
TestPythonSDKFunctions sets them):

    SHEEPFOLD_FUNCTIONS_URL   the server's base URL
    SHEEPFOLD_FUNCTIONS_KEY   an API key
"""

from __future__ import annotations

import json
import math
import os
import os.path as osp
import sys
import unittest
from math import sqrt

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import sheepfold  # noqa: E402
from sheepfold import RemoteError  # noqa: E402

URL = os.environ.get("SHEEPFOLD_FUNCTIONS_URL")
KEY = os.environ.get("SHEEPFOLD_FUNCTIONS_KEY")

SCALE = 10
NOT_SHIPPABLE = object()


def plain(x):
    return x


class TestShipping(unittest.TestCase):
    """What the decorator ships, and what it refuses before sending anything."""

    def test_source_without_decorator(self) -> None:
        @sheepfold.function(memory_mb=256, timeout=5)
        def score(doc, bonus=0):
            """Words, scaled."""
            return len(doc.split()) * SCALE + bonus + math.floor(sqrt(4)) + len(osp.sep)

        code = score.code
        self.assertNotIn("@sheepfold", code)
        self.assertTrue(code.startswith("SCALE = 10\n") or "\nSCALE = 10\n" in code, code)
        self.assertIn("from math import sqrt as sqrt\n", code)
        self.assertIn("import math\n", code)
        self.assertIn("def score(doc, bonus=0):\n", code)
        self.assertIn("def handler(_sf_call):", code)
        # The shipped code alone defines a handler that behaves as the
        # function does here.
        ns: dict = {}
        exec(compile(code, "<shipped>", "exec"), ns)
        self.assertEqual(ns["handler"]({"a": ["a b c"], "k": {"bonus": 1}}), score("a b c", bonus=1))
        self.assertEqual(score("a b"), 23)  # called here, it runs here

    def test_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "lambda"):
            sheepfold.function(lambda x: x)
        z = 1

        def closure(x):
            return x + z

        with self.assertRaisesRegex(ValueError, "closes over z"):
            sheepfold.function(closure)

        def uses_object(x):
            return NOT_SHIPPABLE

        with self.assertRaisesRegex(ValueError, "NOT_SHIPPABLE"):
            sheepfold.function()(uses_object)
        with self.assertRaisesRegex(ValueError, "gpu"):
            sheepfold.function(gpu="T4")(plain)
        with self.assertRaisesRegex(ValueError, "gpu"):
            sheepfold.function(gpu=-1)(plain)
        self.assertEqual(sheepfold.function(gpu=2)(plain).resources.to_dict()["gpu"], 2)
        self.assertEqual(sheepfold.function(gpu="nvidia.com/gpu=1")(plain).resources.to_dict()["devices"], ["nvidia.com/gpu=1"])
        self.assertIsNone(sheepfold.function(plain).resources)
        # The control: the same shapes without what makes them unshippable.
        sheepfold.function(plain)

    def test_remote_error_classes(self) -> None:
        from sheepfold.batches import BatchItemError
        from sheepfold.functions import _remote_error
        e = _remote_error(BatchItemError(name="KeyError", value="'k'", traceback="Traceback (most recent call last):\n  ...\n"))
        self.assertIsInstance(e, KeyError)
        self.assertIsInstance(e, RemoteError)
        self.assertIn("Remote traceback", str(e))
        own = _remote_error(BatchItemError(name="MyError", value="x"))
        self.assertIs(type(own), RemoteError)


@sheepfold.function(concurrency=4, timeout=30, api_key=KEY, base_url=URL)
def word_count(doc):
    if doc == "boom":
        raise ValueError("cannot score " + doc)
    return {"words": len(doc.split()), "doc": doc}


@sheepfold.function(reuse="", api_key=KEY, base_url=URL)
def add(a, b=0):
    return a + b


@unittest.skipUnless(URL and KEY, "set SHEEPFOLD_FUNCTIONS_URL and _KEY")
class TestRemote(unittest.TestCase):
    def test_remote(self) -> None:
        self.assertEqual(add.remote(2, b=3), 5)
        self.assertEqual(add.last_batch.usage.sandboxes, 1)  # the call's (the code is checked on the host)
        self.assertEqual(add.remote([1], [2]), [1, 2])

    def test_map_keeps_order(self) -> None:
        docs = [" ".join(["w"] * (i % 7)) + f" d{i}" for i in range(30)]
        out = list(word_count.map(docs))
        self.assertEqual(out, [{"words": len(d.split()), "doc": d} for d in docs])
        b = word_count.last_batch
        self.assertEqual((b.status, b.done, b.reuse), ("done", 30, "worker"))
        self.assertLessEqual(b.usage.sandboxes, 4)  # one per worker (the code is checked on the host)
        self.assertEqual(list(word_count.map([])), [])

    def test_exception_carried_back(self) -> None:
        it = word_count.map(["a", "boom", "c"])
        self.assertEqual(next(it)["words"], 1)
        with self.assertRaises(ValueError) as cm:
            next(it)
        e = cm.exception
        self.assertIsInstance(e, RemoteError)
        self.assertEqual(e.value, "cannot score boom")
        self.assertIn("in word_count", e.traceback)
        self.assertIn("Remote traceback", str(e))
        got = list(word_count.map(["a", "boom", "c"], return_exceptions=True))
        self.assertEqual(got[0]["doc"], "a")
        self.assertIsInstance(got[1], ValueError)
        self.assertEqual(got[2]["doc"], "c")
        with self.assertRaises(ValueError):
            word_count.remote("boom")
        json.dumps(got[0])


if __name__ == "__main__":
    unittest.main()
