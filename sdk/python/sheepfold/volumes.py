"""The account's persistent volumes: filesystems of a bounded size that its
sandboxes mount when they start and that outlive them.

    from sheepfold import Sandbox, VolumeMount, Volumes

    Volumes().create("data", size_mb=512)
    sbx = Sandbox.create(volume_mounts=[VolumeMount("data", "/home/user/data")])
    sbx.files.write("/home/user/data/notes.txt", "kept")
    sbx.kill()
    again = Sandbox.create(volume_mounts=[VolumeMount("data", "/mnt/data", read_only=True)])
    print(again.files.read("/mnt/data/notes.txt"))   # kept
    print(Volumes().get("data").used_bytes)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional, Union

from ._http import HTTPClient, path_segment
from .models import parse_time

__all__ = ["Volume", "VolumeFile", "VolumeMount", "Volumes"]


@dataclass
class Volume:
    name: str
    size_mb: int
    created_at: Optional[datetime]
    used_bytes: Optional[int] = None  # Volumes.get only
    total_bytes: Optional[int] = None  # Volumes.get only
    mounted_by: List[str] = field(default_factory=list)  # live sandboxes that mount it; Volumes.get only

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Volume":
        return cls(name=d["name"], size_mb=int(d.get("size_mb") or 0), created_at=parse_time(d.get("created_at")),
                   used_bytes=d.get("used_bytes"), total_bytes=d.get("total_bytes"),
                   mounted_by=list(d.get("mounted_by") or []))


@dataclass
class VolumeFile:
    """A file or directory of a volume (the file calls of Volumes, which
    need no sandbox); path is from the volume's root."""
    name: str
    path: str
    type: str  # "file", "dir", "symlink" or "other"
    size: int
    mod_time: Optional[datetime]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "VolumeFile":
        return cls(name=d.get("name", ""), path=d.get("path", ""), type=d.get("type", ""),
                   size=int(d.get("size") or 0), mod_time=parse_time(d.get("mod_time")))


@dataclass
class VolumeMount:
    """A volume to mount in a new sandbox (Sandbox.create's volume_mounts):
    at path (absolute, not in a system directory), read-only when asked; a
    second sandbox may write it at the same time only when both set
    shared (VolumeInUseError otherwise)."""
    name: str
    path: str
    read_only: bool = False
    shared: bool = False

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"name": self.name, "path": self.path}
        if self.read_only:
            d["read_only"] = True
        if self.shared:
            d["shared"] = True
        return d


class Volumes:
    """The key owner's volumes. ConflictError when a name is taken,
    VolumeNotFoundError for a name the account has not (another account's
    included), VolumeInUseError deleting one a live sandbox mounts,
    StorageQuotaExceededError past the account's volumes, NotSupportedError
    on a server whose runtime keeps none."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)

    def create(self, name: str, size_mb: Optional[int] = None) -> Volume:
        body: Dict[str, Any] = {"name": name}
        if size_mb is not None:
            body["size_mb"] = int(size_mb)
        return Volume.from_dict(self._http.post_json("/v1/volumes", body))

    def list(self) -> List[Volume]:
        doc = self._http.get_json("/v1/volumes") or {}
        return [Volume.from_dict(v) for v in doc.get("volumes") or []]

    def get(self, name: str) -> Volume:
        return Volume.from_dict(self._http.get_json(f"/v1/volumes/{path_segment(name)}"))

    def delete(self, name: str) -> None:
        self._http.delete(f"/v1/volumes/{path_segment(name)}")

    # A volume's files, without a sandbox. Paths are from the volume's
    # root; symlinks and ".." never lead out of it.

    def _files(self, name: str) -> str:
        return f"/v1/volumes/{path_segment(name)}/files"

    def write_file(self, name: str, path: str, data: Union[str, bytes]) -> VolumeFile:
        """Write a file (and its missing directories) as the sandboxes'
        user; VolumeInUseError while a sandbox writes the volume,
        DiskFullError when it is full."""
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        resp = self._http.request("PUT", self._files(name), params={"path": path}, body=body,
                                  headers={"Content-Type": "application/octet-stream"})
        return VolumeFile.from_dict(resp.json())

    def read_file(self, name: str, path: str) -> bytes:
        resp = self._http.request("GET", self._files(name), params={"path": path},
                                  headers={"Accept": "application/octet-stream, application/json"})
        return resp.read()

    def list_files(self, name: str, path: str = "/") -> List[VolumeFile]:
        doc = self._http.get_json(self._files(name) + "/list", params={"path": path}) or {}
        return [VolumeFile.from_dict(e) for e in doc.get("entries") or []]

    def remove_file(self, name: str, path: str) -> None:
        """Remove a file, a symlink or an empty directory."""
        self._http.delete(self._files(name), params={"path": path})
