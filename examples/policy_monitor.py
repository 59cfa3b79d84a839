#!/usr/bin/env python3
"""A session under a strict policy: code tries a blocked module, the monitor
sees the security_violation, an alert is raised and the session terminated.

    SHEEPFOLD_API_KEY=sf_... SHEEPFOLD_URL=http://127.0.0.1:8080/v1 \\
    SHEEPFOLD_MODEL=deepseek-chat python3 examples/policy_monitor.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

from sheepfold import Client  # noqa: E402


def main() -> int:
    client = Client(api_key=os.environ.get("SHEEPFOLD_API_KEY"),
                    base_url=os.environ.get("SHEEPFOLD_URL", "http://127.0.0.1:8080/v1"))
    session = client.sessions.create(model=os.environ.get("SHEEPFOLD_MODEL", "deepseek-chat"), sandbox_config={
        "allowed_modules": ["json", "math"], "network_restricted": True, "max_execution_time": 10})
    print("session", session.id)

    r = client.sandbox.execute(session_id=session.id, code="import math\nprint(math.sqrt(2))", timeout_ms=10000)
    print("allowed:", r.status, r.output.strip())
    r = client.sandbox.execute(session_id=session.id, code="import os\nos.listdir('/')", timeout_ms=10000)
    print("blocked:", r.status, r.error.code, r.error.message)

    monitor = client.sandbox.monitor(session_id=session.id)
    for event in monitor.stream():
        print(f"event {event.timestamp:%H:%M:%S} {event.type} {event.details}")
        if event.type == "security_violation":
            alert = client.alerts.create(severity="high", message=f"blocked: {event.details.get('target')}",
                                         session_id=session.id)
            print("alert", alert.id, alert.severity, alert.message)
            monitor.terminate_session(session_id=session.id)
    state = client.sessions.get(session.id).state
    print("session", state)
    return 0 if state == "stopped" else 1


if __name__ == "__main__":
    sys.exit(main())
