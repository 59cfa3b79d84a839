"""Batches (sheepfold.Batches) against a real server.

Skipped unless these are set (internal/server's TestPythonSDKBatches sets them):

    SHEEPFOLD_BATCHES_URL        the server's base URL
    SHEEPFOLD_BATCHES_KEY        an API key
    SHEEPFOLD_BATCHES_OTHER_KEY  an API key of another account
"""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from sheepfold import Batches, InvalidHandlerError, NotFoundError  # noqa: E402

URL = os.environ.get("SHEEPFOLD_BATCHES_URL")
KEY = os.environ.get("SHEEPFOLD_BATCHES_KEY")
OTHER = os.environ.get("SHEEPFOLD_BATCHES_OTHER_KEY")

CODE = "def handler(item):\n    if item == 'boom':\n        raise ValueError(item)\n    return len(item)\n"


@unittest.skipUnless(URL and KEY and OTHER, "set SHEEPFOLD_BATCHES_URL, _KEY and _OTHER_KEY")
class TestBatches(unittest.TestCase):
    def test_lifecycle(self) -> None:
        b = Batches(api_key=KEY, base_url=URL)
        with self.assertRaises(InvalidHandlerError):
            b.create("def handler(item)\n", [1])
        inputs = ["x" * i for i in range(12)] + ["boom"]
        made = b.create(CODE, inputs, concurrency=4)
        self.assertEqual((made.status, made.total), ("running", 13))
        done = b.wait(made.id, poll=0.02, timeout=60)
        self.assertEqual((done.status, done.done, done.failed, done.pending), ("done", 12, 1, 0))
        res = list(b.results(made.id, page=5))
        self.assertEqual([r.index for r in res], list(range(13)))
        self.assertEqual([r.result for r in res[:12]], list(range(12)))
        self.assertEqual((res[12].status, res[12].error.name, res[12].error.value), ("failed", "ValueError", "boom"))
        self.assertEqual([x.id for x in b.list()], [made.id])
        with self.assertRaises(NotFoundError):
            Batches(api_key=OTHER, base_url=URL).get(made.id)


if __name__ == "__main__":
    unittest.main()
