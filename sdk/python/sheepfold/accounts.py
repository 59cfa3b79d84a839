"""Accounts, limits, usage, credits and alerts.

    from sheepfold import Account

    acct = Account()                                   # the key's own account
    print(acct.info()["limits"])                       # effective limits (0: unlimited)
    report = acct.usage(group_by="sandbox")            # this month, with estimated cost
    print(report["total"]["cpu_seconds"], report["total"]["cost"])
    print(acct.sandbox_usage(sb.sandbox_id))           # live while it runs
    print(acct.credits().balance)
    alert = acct.create_alert("high", "agent tried to escape", sandbox_id=sb.sandbox_id)
    acct.ack_alert(alert.id)

    from sheepfold import Admin                        # an admin key
    admin = Admin(api_key=ADMIN_KEY)
    admin.create_account("team", limits={"max_sandboxes": 5})
    key = admin.create_key("team", name="ci")["key"]   # the secret, shown once
    admin.set_limits("team", requests_per_minute=600, reset=["max_cpus"])
    admin.credit("team", "25.00", reason="pilot")

Reports and accounts are the server's JSON objects (see api/openapi.json);
credits and alerts are dataclasses. Amounts are micro-units of the
operator's currency, or decimal strings ("25.000000").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence, Union

from ._http import HTTPClient, path_segment
from .models import parse_time

__all__ = ["Account", "Admin", "Alert", "Credits"]


@dataclass
class Credits:
    balance: str  # the ledger's sum, as a decimal string
    balance_micros: int
    free_micros: int
    free_left_micros: int
    granted_micros: int
    spent_micros: int
    pending_micros: int  # metered, not yet in the ledger
    available_micros: int  # balance - pending
    enforced: bool

    @property
    def free_credits(self) -> float:
        """Free credits left, in units of the operator's currency."""
        return self.free_left_micros / 1e6

    @property
    def balance_units(self) -> float:
        """The balance, in units of the operator's currency."""
        return self.balance_micros / 1e6

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Credits":
        return cls(balance=d.get("balance", "0.000000"), balance_micros=int(d.get("balance_micros", 0)),
                   free_micros=int(d.get("free_micros", 0)), free_left_micros=int(d.get("free_left_micros", 0)),
                   granted_micros=int(d.get("granted_micros", 0)), spent_micros=int(d.get("spent_micros", 0)),
                   pending_micros=int(d.get("pending_micros", 0)), available_micros=int(d.get("available_micros", 0)),
                   enforced=bool(d.get("enforced")))


@dataclass
class Alert:
    id: str
    severity: str  # low, medium, high, critical
    kind: str  # manual, quota, credits, security_violation
    message: str
    created_at: Optional[datetime]
    acknowledged: bool
    sandbox_id: Optional[str] = None
    session_id: Optional[str] = None
    acknowledged_at: Optional[datetime] = None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Alert":
        return cls(id=d["id"], severity=d.get("severity", ""), kind=d.get("kind", ""), message=d.get("message", ""),
                   created_at=parse_time(d.get("created_at")), acknowledged=bool(d.get("acknowledged")),
                   sandbox_id=d.get("sandbox_id"), session_id=d.get("session_id"),
                   acknowledged_at=parse_time(d.get("acknowledged_at")))


def _time(v: Union[datetime, str, None]) -> Optional[str]:
    if isinstance(v, datetime):
        return v.isoformat().replace("+00:00", "Z") if v.tzinfo else v.isoformat() + "Z"
    return v


class Account:
    """The account of the API key: its limits, usage, credits and alerts."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)

    def info(self) -> Dict[str, Any]:
        """The account: id, name, limits, overrides, running_sandboxes, month, credits,
        storage (records and bytes it keeps in the server's database, in all and by
        kind, with each kind's max_records and max_bytes)."""
        return self._http.get_json("/v1/account")

    def usage(self, from_: Union[datetime, str, None] = None, to: Union[datetime, str, None] = None,
              group_by: Optional[str] = None) -> Dict[str, Any]:
        """Metered usage with estimated cost: {from, to, group_by, groups, total, prices}.
        group_by is day (the default), hour, sandbox or template."""
        return self._http.get_json("/v1/account/usage",
                                   params={"from": _time(from_), "to": _time(to), "group_by": group_by})

    def sandbox_usage(self, sandbox_id: str) -> Dict[str, Any]:
        """One sandbox's usage so far (``live`` while it runs)."""
        return self._http.get_json(f"/v1/sandboxes/{path_segment(sandbox_id)}/usage")

    def credits(self) -> Credits:
        return Credits.from_dict(self._http.get_json("/v1/account/credits"))

    def create_alert(self, severity: str, message: str, sandbox_id: Optional[str] = None,
                     session_id: Optional[str] = None) -> Alert:
        body: Dict[str, Any] = {"severity": severity, "message": message}
        if sandbox_id:
            body["sandbox_id"] = sandbox_id
        if session_id:
            body["session_id"] = session_id
        return Alert.from_dict(self._http.post_json("/v1/alerts", body))

    def alerts(self, unacknowledged: bool = False) -> List[Alert]:
        doc = self._http.get_json("/v1/alerts", params={"unacknowledged": unacknowledged}) or {}
        return [Alert.from_dict(a) for a in doc.get("alerts") or []]

    def ack_alert(self, alert: Union[Alert, str]) -> Alert:
        alert_id = alert.id if isinstance(alert, Alert) else alert
        return Alert.from_dict(self._http.post_json(f"/v1/alerts/{path_segment(alert_id)}/ack"))


class Admin:
    """Account management: needs an admin key (``sheepfold keys create --admin``)."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)

    def create_account(self, name: str, limits: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"name": name}
        if limits:
            body["limits"] = limits
        return self._http.post_json("/v1/admin/accounts", body)

    def list_accounts(self) -> List[Dict[str, Any]]:
        return list((self._http.get_json("/v1/admin/accounts") or {}).get("accounts") or [])

    def get_account(self, account: str) -> Dict[str, Any]:
        return self._http.get_json(f"/v1/admin/accounts/{path_segment(account)}")

    def set_limits(self, account: str, reset: Sequence[str] = (), **limits: Any) -> Dict[str, Any]:
        """Set some limits (max_sandboxes=5, max_cpus=2, ...); names in reset go back to the defaults."""
        body: Dict[str, Any] = dict(limits)
        for name in reset:
            body[name] = None
        return self._http.post_json(f"/v1/admin/accounts/{path_segment(account)}/limits", body)

    def credit(self, account: str, amount: str, reason: str = "") -> Credits:
        """Grant credits: a decimal string such as "25.00" (negative takes them back)."""
        return Credits.from_dict(self._http.post_json(f"/v1/admin/accounts/{path_segment(account)}/credits",
                                                      {"amount": str(amount), "reason": reason}))

    def create_key(self, account: str, name: str = "", admin: bool = False, e2b: bool = False) -> Dict[str, Any]:
        """A new key of the account; its secret is ``["key"]``, shown only here."""
        return self._http.post_json("/v1/admin/keys", {"account": account, "name": name, "admin": admin, "e2b": e2b})
