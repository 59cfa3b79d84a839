"""``sandbox.files``: the sandbox's filesystem.

Paths are absolute, or relative to /home/user; nothing escapes the sandbox.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._http import HTTPClient, path_segment
from .errors import NotFoundError
from .models import FileInfo

__all__ = ["Filesystem", "FilePage", "WriteEntry"]

Data = Union[str, bytes, bytearray, memoryview, IO[bytes], IO[str]]


@dataclass
class FilePage:
    """One page of a directory listing (:meth:`Filesystem.list_page`)."""

    entries: List[FileInfo]
    next_cursor: Optional[str]  # pass as cursor for the next page; None on the last


@dataclass
class WriteEntry:
    """One file for :meth:`Filesystem.write_files`."""

    path: str
    data: Data


def _to_bytes(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return _to_bytes(data.read())
    raise TypeError(f"file data must be str, bytes or a file object, not {type(data).__name__}")


def _multipart(files: Sequence[Tuple[str, bytes]]) -> Tuple[bytes, str]:
    """Encode files as multipart/form-data, each part named "file"."""
    boundary = "sheepfold-" + uuid.uuid4().hex
    out = bytearray()
    for name, data in files:
        # Quote the filename as browsers do (RFC 7578 §4.2): escape " and \, no CR/LF.
        safe = name.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
        out += f"--{boundary}\r\n".encode()
        out += f'Content-Disposition: form-data; name="file"; filename="{safe}"\r\n'.encode("utf-8")
        out += b"Content-Type: application/octet-stream\r\n\r\n"
        out += data
        out += b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


class Filesystem:
    """File operations in one sandbox (``sandbox.files``)."""

    def __init__(self, http: HTTPClient, sandbox_id: str) -> None:
        self._http = http
        self._base = f"/v1/sandboxes/{path_segment(sandbox_id)}/files"

    def read(self, path: str, format: str = "text", request_timeout: Optional[float] = None) -> Union[str, bytes]:
        """Download a file: a str (UTF-8) by default, bytes with format="bytes"."""
        if format not in ("text", "bytes"):
            raise ValueError('format must be "text" or "bytes"')
        kw: Dict[str, Any] = {}
        if request_timeout is not None:
            kw["timeout"] = request_timeout
        resp = self._http.request("GET", self._base, params={"path": path},
                                  headers={"Accept": "application/octet-stream, application/json"}, **kw)
        data = resp.read()
        return data if format == "bytes" else data.decode("utf-8")

    def read_bytes(self, path: str) -> bytes:
        return self.read(path, format="bytes")  # type: ignore[return-value]

    def write(self, path: str, data: Data, mode: Optional[int] = None,
              request_timeout: Optional[float] = None) -> FileInfo:
        """Write one file atomically (str is encoded as UTF-8); returns its FileInfo.

        ``mode`` (e.g. ``0o755``) sets the permission bits.
        """
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "04o")
        kw: Dict[str, Any] = {}
        if request_timeout is not None:
            kw["timeout"] = request_timeout
        resp = self._http.request("PUT", self._base, params=params, body=_to_bytes(data),
                                  headers={"Content-Type": "application/octet-stream"}, **kw)
        return FileInfo.from_dict(resp.json())

    def write_files(self, files: Iterable[Union[WriteEntry, Mapping[str, Any], Tuple[str, Data]]],
                    request_timeout: Optional[float] = None) -> List[FileInfo]:
        """Upload several files with multipart/form-data.

        ``files`` holds WriteEntry objects, ``{"path": ..., "data": ...}``
        dicts or ``(path, data)`` tuples. Files are grouped by directory:
        one upload request per directory.
        """
        groups: Dict[str, List[Tuple[str, bytes]]] = {}
        for f in files:
            if isinstance(f, WriteEntry):
                p, d = f.path, f.data
            elif isinstance(f, Mapping):
                p, d = f["path"], f["data"]
            else:
                p, d = f
            dirname, name = posixpath.split(p)
            if not name:
                raise ValueError(f"not a file path: {p!r}")
            groups.setdefault(dirname, []).append((name, _to_bytes(d)))
        kw: Dict[str, Any] = {}
        if request_timeout is not None:
            kw["timeout"] = request_timeout
        out: List[FileInfo] = []
        for dirname, parts in groups.items():
            body, ctype = _multipart(parts)
            resp = self._http.request("POST", self._base, params={"path": dirname or None}, body=body,
                                      headers={"Content-Type": ctype}, **kw)
            doc = resp.json() or {}
            out.extend(FileInfo.from_dict(x) for x in doc.get("files") or [])
        return out

    def upload(self, local_path: Union[str, os.PathLike], path: Optional[str] = None) -> FileInfo:
        """Upload a local file (to ``path``, default: its base name in /home/user)."""
        with open(local_path, "rb") as fh:
            data = fh.read()
        return self.write(path or os.path.basename(os.fspath(local_path)), data)

    def download(self, path: str, local_path: Union[str, os.PathLike]) -> None:
        """Download a file to a local path."""
        data = self.read(path, format="bytes")
        with open(local_path, "wb") as fh:
            fh.write(data)  # type: ignore[arg-type]

    def list(self, path: str = "/home/user", depth: int = 1) -> List[FileInfo]:
        """The entries of a directory, down to ``depth`` levels (1 to 32), every
        page of them: each directory's entries by name, a directory's contents
        right after it."""
        out: List[FileInfo] = []
        cursor: Optional[str] = None
        while True:
            page = self.list_page(path, depth=depth, cursor=cursor)
            out.extend(page.entries)
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    def list_page(self, path: str = "/home/user", depth: int = 1, cursor: Optional[str] = None,
                  limit: Optional[int] = None) -> "FilePage":
        """One page of a directory's entries (at most ``limit``, 1 to 10000);
        pass its ``next_cursor`` as ``cursor``, with the same path and depth,
        for the next."""
        doc = self._http.get_json(self._base + "/list", params={
            "path": path, "depth": depth, "cursor": cursor, "limit": limit}) or {}
        return FilePage(entries=[FileInfo.from_dict(x) for x in doc.get("entries") or []],
                        next_cursor=doc.get("next_cursor"))

    def get_info(self, path: str) -> FileInfo:
        """Stat a path; raises NotFoundError when it does not exist."""
        return FileInfo.from_dict(self._http.get_json(self._base + "/stat", params={"path": path}))

    def exists(self, path: str) -> bool:
        try:
            self.get_info(path)
        except NotFoundError as e:
            if e.code == "ERR_SANDBOX_NOT_FOUND":
                raise
            return False
        return True

    def remove(self, path: str) -> None:
        """Remove a file or a directory (with its contents)."""
        self._http.delete(self._base, params={"path": path})

    def make_dir(self, path: str) -> FileInfo:
        """Create a directory (and its parents)."""
        return FileInfo.from_dict(self._http.post_json(self._base + "/mkdir", {"path": path}))

    def rename(self, old_path: str, new_path: str) -> FileInfo:
        """Move or rename a path; returns the FileInfo at its new place."""
        return FileInfo.from_dict(self._http.post_json(self._base + "/move", {"from": old_path, "to": new_path}))

    move = rename
