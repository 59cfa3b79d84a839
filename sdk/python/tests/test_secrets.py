"""Secrets (sheepfold.Secrets) against a real server.

Skipped unless these are set (internal/server's TestPythonSDKSecrets sets them):

    SHEEPFOLD_SECRETS_URL      the server's base URL
    SHEEPFOLD_SECRETS_KEY      an API key
    SHEEPFOLD_SECRETS_OTHER_KEY  an API key of another account
"""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from sheepfold import InvalidArgumentError, ConflictError, NotFoundError, Secrets  # noqa: E402

URL = os.environ.get("SHEEPFOLD_SECRETS_URL")
KEY = os.environ.get("SHEEPFOLD_SECRETS_KEY")
OTHER = os.environ.get("SHEEPFOLD_SECRETS_OTHER_KEY")


@unittest.skipUnless(URL and KEY and OTHER, "set SHEEPFOLD_SECRETS_URL, _KEY and _OTHER_KEY")
class TestSecrets(unittest.TestCase):
    def test_lifecycle(self) -> None:
        s = Secrets(api_key=KEY, base_url=URL)
        value = "py-sk-0c4e7d1f"
        made = s.create("py_token", value, metadata={"env": "ci"})
        self.assertEqual((made.name, made.version, made.metadata, made.last_used_at), ("py_token", 1, {"env": "ci"}, None))
        self.assertIsNotNone(made.created_at)
        self.assertNotIn(value, repr(made))
        with self.assertRaises(ConflictError):
            s.create("py_token", "other")
        with self.assertRaises(InvalidArgumentError):
            s.create("py.token", "x")
        rotated = s.rotate("py_token", "py-sk-second")
        self.assertEqual((rotated.version, rotated.metadata), (2, {"env": "ci"}))
        self.assertEqual([x.name for x in s.list()], ["py_token"])
        self.assertEqual((s.get("py_token").version, s.get("py_token").use_count), (2, 0))
        self.assertEqual(s.uses("py_token", limit=10), [])
        with self.assertRaises(NotFoundError):
            Secrets(api_key=OTHER, base_url=URL).uses("py_token")
        with self.assertRaises(NotFoundError):
            Secrets(api_key=OTHER, base_url=URL).get("py_token")
        s.delete("py_token")
        with self.assertRaises(NotFoundError):
            s.delete("py_token")
        self.assertEqual(s.list(), [])


if __name__ == "__main__":
    unittest.main()
