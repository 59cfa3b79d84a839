"""Preview ports: the ports a sandbox listens on, their preview URLs, and
whether they are public."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, List, Mapping, Optional

from .models import parse_time

__all__ = ["Port", "PortList"]


def _d(data: Any) -> Mapping[str, Any]:
    return data if isinstance(data, Mapping) else {}


@dataclass
class Port:
    """One port of a sandbox as GET /v1/sandboxes/{id}/ports shows it.

    url is the host form ``http://{port}-{id}.{preview domain}/`` ("" when
    the server has no preview domain), proxy_url the path form
    ``.../v1/sandboxes/{id}/proxy/{port}/``; signed_url opens the preview
    in a browser (it sets a cookie) until signed_url_expires_at, public or
    not. A private port's preview otherwise needs the sandbox's token
    (:attr:`PortList.token`) in the :attr:`PortList.token_header` header.
    """

    port: int
    listening: bool = False
    addresses: List[str] = field(default_factory=list)
    public: bool = False
    url: str = ""
    proxy_url: str = ""
    signed_url: str = ""
    signed_url_expires_at: Optional[datetime] = None

    @property
    def preview_url(self) -> str:
        """The port's preview URL: the host form when the server has a
        preview domain, else the path form."""
        return self.url or self.proxy_url

    @classmethod
    def from_dict(cls, data: Any) -> "Port":
        d = _d(data)
        return cls(port=int(d.get("port") or 0), listening=bool(d.get("listening")),
                   addresses=[str(a) for a in d.get("addresses") or []], public=bool(d.get("public")),
                   url=d.get("url") or "", proxy_url=d.get("proxy_url") or "",
                   signed_url=d.get("signed_url") or "",
                   signed_url_expires_at=parse_time(d.get("signed_url_expires_at")))


@dataclass
class PortList:
    """A sandbox's listening ports and the ports made public, by number,
    with the sandbox's preview token."""

    ports: List[Port] = field(default_factory=list)
    token: str = ""
    token_header: str = "Sheepfold-Preview-Token"

    def get(self, port: int) -> Optional[Port]:
        """The entry of port, or None when it neither listens nor is public."""
        for p in self.ports:
            if p.port == port:
                return p
        return None

    @property
    def headers(self) -> dict:
        """The header that opens any private port of the sandbox."""
        return {self.token_header: self.token}

    @classmethod
    def from_dict(cls, data: Any) -> "PortList":
        d = _d(data)
        return cls(ports=[Port.from_dict(p) for p in d.get("ports") or []], token=d.get("token") or "",
                   token_header=d.get("token_header") or "Sheepfold-Preview-Token")
