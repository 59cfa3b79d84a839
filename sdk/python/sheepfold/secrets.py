"""The account's secrets: named values stored sealed by the server and never
given back (no call returns a value).

    from sheepfold import Secrets

    s = Secrets().create("openai", "sk-...", metadata={"team": "ml"})
    print(s.version, s.created_at)         # never the value
    Secrets().rotate("openai", "sk-new")   # a new version; the older value is gone
    for u in Secrets().uses("openai"):    # each use at the egress gateway
        print(u.at, u.sandbox_id, u.method, u.host, u.path, u.outcome)
    Secrets().delete("openai")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional

from ._http import HTTPClient, path_segment
from .models import parse_time

__all__ = ["Secret", "SecretUse", "Secrets"]


@dataclass
class Secret:
    name: str
    version: int
    created_at: Optional[datetime]
    updated_at: Optional[datetime]  # when the current version was stored
    last_used_at: Optional[datetime] = None  # None: never used
    metadata: Dict[str, str] = field(default_factory=dict)
    use_count: int = 0  # requests the egress gateway put the value into

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Secret":
        return cls(name=d["name"], version=int(d.get("version") or 0), created_at=parse_time(d.get("created_at")),
                   updated_at=parse_time(d.get("updated_at")), last_used_at=parse_time(d.get("last_used_at")),
                   metadata=dict(d.get("metadata") or {}), use_count=int(d.get("use_count") or 0))


@dataclass
class SecretUse:
    """One use of a secret at the egress gateway: outcome "injected" (the
    value went into the request), "misdirected" (its placeholder was sent
    where it is not substituted: refused) or "unavailable" (the value could
    not be resolved: refused)."""
    id: int
    sandbox_id: str
    host: str
    method: str
    path: str
    outcome: str
    at: Optional[datetime]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SecretUse":
        return cls(id=int(d["id"]), sandbox_id=d.get("sandbox_id", ""), host=d.get("host", ""), method=d.get("method", ""),
                   path=d.get("path", ""), outcome=d.get("outcome", ""), at=parse_time(d.get("at")))


class Secrets:
    """The key owner's secrets. Values are write-only: ``create`` and
    ``rotate`` send one, nothing returns one. ConflictError when a name is
    taken, NotFoundError for a name the account has not, InvalidArgumentError for
    a bad name (1 to 64 letters, digits, underscores and hyphens, starting
    with a letter or an underscore) or value (1 byte to 32 KiB), StorageQuotaExceededError past the
    account's bound."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)

    def create(self, name: str, value: str, metadata: Optional[Mapping[str, str]] = None) -> Secret:
        body: Dict[str, Any] = {"name": name, "value": value}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        return Secret.from_dict(self._http.post_json("/v1/secrets", body))

    def list(self) -> List[Secret]:
        doc = self._http.get_json("/v1/secrets") or {}
        return [Secret.from_dict(s) for s in doc.get("secrets") or []]

    def get(self, name: str) -> Secret:
        return Secret.from_dict(self._http.get_json(f"/v1/secrets/{path_segment(name)}"))

    def rotate(self, name: str, value: str, metadata: Optional[Mapping[str, str]] = None) -> Secret:
        """Store a new version of the value; metadata, when given, replaces the secret's."""
        body: Dict[str, Any] = {"value": value}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        return Secret.from_dict(self._http.request("PUT", f"/v1/secrets/{path_segment(name)}", json_body=body).json())

    def delete(self, name: str) -> None:
        self._http.delete(f"/v1/secrets/{path_segment(name)}")

    def uses(self, name: str, limit: Optional[int] = None, before: Optional[int] = None) -> List[SecretUse]:
        """The secret's uses, newest first: at most limit (1 to 1000; the
        server's 100 when None), with ids below before (the last use's id
        gives the next page)."""
        q = []
        if limit is not None:
            q.append(f"limit={int(limit)}")
        if before is not None:
            q.append(f"before={int(before)}")
        path = f"/v1/secrets/{path_segment(name)}/uses" + ("?" + "&".join(q) if q else "")
        doc = self._http.get_json(path) or {}
        return [SecretUse.from_dict(u) for u in doc.get("uses") or []]
