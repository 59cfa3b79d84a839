"""Volumes (sheepfold.Volumes, Sandbox.create's volume_mounts) against a
real server.

Skipped unless these are set (internal/server's TestPythonSDKVolumes sets them):

    SHEEPFOLD_VOLUMES_URL        the server's base URL
    SHEEPFOLD_VOLUMES_KEY        an API key
    SHEEPFOLD_VOLUMES_OTHER_KEY  an API key of another account
"""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from sheepfold import (  # noqa: E402
    ConflictError, InvalidArgumentError, NotFoundError, Sandbox, VolumeInUseError, VolumeMount, VolumeNotFoundError, Volumes,
)

URL = os.environ.get("SHEEPFOLD_VOLUMES_URL")
KEY = os.environ.get("SHEEPFOLD_VOLUMES_KEY")
OTHER = os.environ.get("SHEEPFOLD_VOLUMES_OTHER_KEY")


@unittest.skipUnless(URL and KEY and OTHER, "set SHEEPFOLD_VOLUMES_URL, _KEY and _OTHER_KEY")
class TestVolumes(unittest.TestCase):
    def test_lifecycle(self) -> None:
        v = Volumes(api_key=KEY, base_url=URL)
        made = v.create("py-data", size_mb=16)
        self.assertEqual((made.name, made.size_mb, made.used_bytes), ("py-data", 16, None))
        with self.assertRaises(ConflictError):
            v.create("py-data", size_mb=16)
        with self.assertRaises(InvalidArgumentError):
            v.create("../x")
        self.assertEqual([x.name for x in v.list()], ["py-data"])
        sbx = Sandbox.create(volume_mounts=[{"name": "py-data", "path": "/data"}],
                             api_key=KEY, base_url=URL)
        try:
            got = v.get("py-data")
            self.assertEqual(got.mounted_by, [sbx.sandbox_id])
            self.assertIsNotNone(got.used_bytes)
            self.assertEqual(sbx.get_info().volume_mounts, [VolumeMount("py-data", "/data")])
            with self.assertRaises(VolumeInUseError):
                v.delete("py-data")
            other = Volumes(api_key=OTHER, base_url=URL)
            with self.assertRaises(VolumeNotFoundError):
                other.get("py-data")
            with self.assertRaises(VolumeNotFoundError):
                other.delete("py-data")
            with self.assertRaises(VolumeNotFoundError):
                Sandbox.create(volume_mounts=[VolumeMount("py-data", "/data")], api_key=OTHER, base_url=URL)
            with self.assertRaises(VolumeInUseError):
                v.write_file("py-data", "/x", "x")
        finally:
            sbx.kill()
        f = v.write_file("py-data", "/in/a.txt", "hello")
        self.assertEqual((f.path, f.size, f.type), ("/in/a.txt", 5, "file"))
        self.assertEqual(v.read_file("py-data", "in/a.txt"), b"hello")
        self.assertEqual([(e.name, e.type) for e in v.list_files("py-data")], [("in", "dir")])
        with self.assertRaises(VolumeNotFoundError):
            Volumes(api_key=OTHER, base_url=URL).read_file("py-data", "/in/a.txt")
        v.remove_file("py-data", "/in/a.txt")
        with self.assertRaises(NotFoundError):
            v.read_file("py-data", "/in/a.txt")
        v.delete("py-data")
        with self.assertRaises(VolumeNotFoundError):
            v.get("py-data")


if __name__ == "__main__":
    unittest.main()
