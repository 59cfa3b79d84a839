#!/usr/bin/env python3
# Seed 002's workflow, as the article writes it: a sandboxed session, an
# execution, the "recommended" security policy applied, the monitor that
# raises an alert and terminates the session at a security violation, then
# the account's usage and credits.
#
#     export YOUR_HOLYSHEEP_API_KEY=sf_...                   # a Sheepfold key
#     export HOLYSHEEP_BASE_URL=http://127.0.0.1:8080/v1     # a Sheepfold server
#     python3 examples/seed002_sandboxing.py
#
# What was changed from the article, and why (nothing else was):
#  1. The import: the article's `from holysheep import HolySheepClient`
#     names a package that does not exist; Sheepfold's client is
#     `sheepfold.Client` (sdk/python), imported under the article's name.
#  2. The URL: the article's base_url literal becomes $HOLYSHEEP_BASE_URL,
#     the variable its own set-up section exports.
#  3. Lost '#' markers: the article lost the '#' of its comment lines
#     ("Configuration du sandbox avec limites de ressources", "Code
#     utilisateur - entièrement isolé"...), which are not Python; they
#     are comments again here. One of them is inside the executed code.
#  4. The article runs its error 3 (`import os`, blocked) as a separate
#     snippet; here it runs before the monitor, so that the monitor has a
#     security violation to see (otherwise its loop would wait for the
#     session's end).
#  5. The usage and credits lines are those of the article's error 4
#     ("Vérifier le quota").

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

from sheepfold import Client as HolySheepClient  # noqa: E402  (1)

client = HolySheepClient(
    api_key=os.environ.get("YOUR_HOLYSHEEP_API_KEY"),
    base_url=os.environ["HOLYSHEEP_BASE_URL"]  # (2)
)


# Configuration du sandbox avec limites de ressources  (3)

sandbox_config = {
    "max_execution_time": 30,  # secondes
    "max_memory_mb": 512,
    "allowed_modules": ["json", "math", "re", "datetime"],
    "network_restricted": True,
    "filesystem_readonly": False,
    "filesystem_paths_whitelist": ["/tmp/sandbox/", "/var/tmp/"]
}


# Création d'une session sandboxée  (3)

session = client.sessions.create(
    model="claude-sonnet-4.5",
    sandbox_config=sandbox_config
)

print(f"Session sandboxée créée: {session.id}")

# Exécution d'un code Python dans le sandbox
result = client.sandbox.execute(
    session_id=session.id,
    code="""
import json
import math


# Code utilisateur - entièrement isolé  (3)

user_input = {"operation": "calculate", "value": 16}

if user_input["operation"] == "calculate":
    result = math.sqrt(user_input["value"])
    print(f"Résultat: {result}")
else:
    print("Opération non autorisée")
""",
    language="python"
)

print(f"Résultat: {result.output}")
print(f"Statut: {result.status}")  # success, timeout, error
print(f"Temps d'exécution: {result.execution_time_ms}ms")

# Politique de sécurité complète
security_policy = {
    "resource_limits": {
        "cpu_time_seconds": 10,
        "memory_mb": 256,
        "disk_write_mb": 50,
        "network_requests": 5,
        "file_size_upload_mb": 10
    },
    "access_control": {
        "allow_subprocess": False,
        "allow_import_system": False,
        "allowed_imports": [
            "json", "math", "random", "datetime", 
            "re", "collections", "itertools", "functools"
        ],
        "blocked_modules": [
            "os", "sys", "subprocess", "socket",
            "urllib", "requests", "ctypes", "sqlite3"
        ]
    },
    "output_filtering": {
        "max_output_length": 10000,
        "strip_sensitive_data": True,
        "sanitize_errors": True
    },
    "rate_limiting": {
        "requests_per_minute": 60,
        "concurrent_sessions": 5
    }
}


# Application de la politique  (3)

client.sandbox.apply_policy(
    session_id=session.id,
    policy=security_policy
)

# ❌ ERREUR : "Module 'os' is blocked by security policy"  (4)
result = client.sandbox.execute(
    session_id=session.id,
    code="""
import os
print(os.listdir('/'))
""",
    language="python"
)
print(f"Erreur: {result.error.code}: {result.error.message}")

# Configuration du monitoring temps réel
monitoring = client.sandbox.monitor(session_id=session.id)

for event in monitoring.stream():
    print(f"[{event.timestamp}] {event.type}: {event.details}")
    
    # Alertes automatisées
    if event.type == "security_violation":
        client.alerts.create(
            severity="high",
            message=f"Violation détectée: {event.details}",
            session_id=session.id
        )
        monitoring.terminate_session(session_id=session.id)
    
    if event.type == "resource_exceeded":
        print("⚠️ Limite de ressource atteinte - session terminée")
        break

# ✅ SOLUTION : Vérifier le quota et utiliser un modèle économique  (5)

usage = client.account.get_usage()
print(f"Usage actuel: {usage.tokens_used}/ {usage.tokens_limit}")

credits = client.account.get_credits()
print(f"Crédits gratuits restants: {credits.free_credits}")
