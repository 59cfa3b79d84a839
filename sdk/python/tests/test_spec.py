"""The SDK's models against the API's OpenAPI document, field for field.

Each model names the schema it reads, the fields it renames, the fields
of its own (not on the wire) and the wire fields it leaves in ``raw``,
each with why. A field added to a schema, or to a model, fails here
until the other side (or this table, with a reason) follows. Every data
class of the package must be in the table.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import sheepfold  # noqa: E402
from sheepfold import accounts, batches, client, events, models, secrets, volumes  # noqa: E402

SPEC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "api", "openapi.json")

RAW = "the response as the server sent it"

# model: (schema, {model field: wire field}, {model-only field: why}, {wire field: why not modelled})
TABLE = {
    models.Resources: ("Resources", {}, {}, {}),
    models.SandboxInfo: ("Sandbox", {"sandbox_id": "id"}, {"raw": RAW}, {}),
    models.SnapshotInfo: ("Snapshot", {}, {}, {}),
    models.SnapshotPool: ("SnapshotPool", {}, {}, {}),
    models.Diff: ("Diff", {}, {}, {}),
    models.Adopted: ("AdoptResult", {}, {}, {}),
    models.Result: ("Result", {}, {"raw": RAW}, {}),
    models.ExecutionError: ("ExecError", {}, {}, {}),
    models.Execution: ("Execution", {}, {"raw": RAW, "logs": "stdout and stderr as E2B's logs lists"},
                       {"stdout": "in logs", "stderr": "in logs"}),
    models.Logs: (None, {}, {"stdout": "Execution.stdout, E2B's shape", "stderr": "Execution.stderr, E2B's shape"}, {}),
    models.CodeContext: ("Context", {}, {}, {}),
    models.CommandResult: ("Command", {}, {"raw": RAW}, {}),
    models.ProcessInfo: ("Process", {}, {}, {}),
    models.FileInfo: ("FileInfo", {}, {}, {"metadata": "E2B's metadata, set and read through the E2B surface"}),
    models.EntryInfo: ("FileInfo", {}, {}, {"metadata": "E2B's metadata, set and read through the E2B surface"}),
    models.PolicyAnswer: ("PolicyAnswer", {}, {}, {}),
    accounts.Credits: ("Credits", {}, {}, {}),
    accounts.Alert: ("Alert", {}, {}, {}),
    client.Session: ("Session", {}, {"raw": RAW}, {}),
    client.SessionExecution: ("SessionExecution", {}, {}, {}),
    client.Answer: ("Answer", {}, {}, {}),
    client.Step: ("AskStep", {}, {}, {}),
    client.Tokens: ("Answer.tokens", {}, {}, {}),
    client.Usage: ("UsageReport", {}, {"raw": RAW}, {
        "from": "the period asked for, in raw",
        "to": "the period asked for, in raw",
        "group_by": "the grouping asked for, in raw",
        "groups": "grouped reports are Client.usage's raw",
        "prices": "the server's prices, in raw",
        "storage": "the storage figures, in raw and in total",
    }),
    events.Event: ("Event", {}, {}, {}),
    events.EventPage: ("EventList", {}, {}, {}),
    events.Webhook: ("Webhook", {}, {}, {}),
    events.WebhookDelivery: ("WebhookDelivery", {}, {}, {}),
    secrets.Secret: ("Secret", {}, {}, {}),
    secrets.SecretUse: ("SecretUse", {}, {}, {}),
    volumes.Volume: ("Volume", {}, {}, {}),
    volumes.VolumeMount: ("VolumeMount", {}, {}, {}),
    volumes.VolumeFile: ("VolumeFile", {}, {}, {}),
    batches.Batch: ("Batch", {}, {}, {}),
    batches.BatchError: ("BatchError", {}, {}, {}),
    batches.BatchItemError: ("BatchItemError", {}, {}, {}),
    batches.BatchResult: ("BatchResult", {}, {}, {}),
    batches.BatchUsage: ("BatchUsage", {}, {}, {}),
}


def schema_properties(spec, name):
    schemas = spec["components"]["schemas"]
    if "." in name:  # Schema.property: an inline object
        outer, prop = name.split(".", 1)
        return set(schemas[outer]["properties"][prop]["properties"])
    return set(schemas[name].get("properties", {}))


class SpecTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(SPEC) as f:
            cls.spec = json.load(f)

    def test_models_match_schemas(self):
        for model, (schema, renames, own, unmodelled) in TABLE.items():
            with self.subTest(model=model.__name__):
                fields = {f.name for f in dataclasses.fields(model)}
                for f in list(renames) + list(own):
                    self.assertIn(f, fields, f"{model.__name__}: stale table entry {f}")
                if schema is None:
                    self.assertEqual(fields, set(own), f"{model.__name__} has fields the table does not explain")
                    continue
                wire = schema_properties(self.spec, schema)
                for w in list(renames.values()) + list(unmodelled):
                    self.assertIn(w, wire, f"{model.__name__}: {schema} has no {w}")
                got = {renames.get(f, f) for f in fields - set(own)}
                self.assertEqual(got - wire, set(), f"{model.__name__}: fields {schema} does not have")
                self.assertEqual(wire - set(unmodelled) - got, set(), f"{model.__name__}: {schema}'s fields it lacks")

    def test_every_model_is_checked(self):
        for mod in (models, accounts, batches, client, events, secrets, volumes):
            for name, cls in inspect.getmembers(mod, inspect.isclass):
                if dataclasses.is_dataclass(cls) and cls.__module__ == mod.__name__:
                    self.assertTrue(cls in TABLE, f"{mod.__name__}.{name} is a model the spec check does not know")

    def test_package_is_this_tree(self):
        # The check must read this tree's spec and SDK, not an installed copy.
        self.assertTrue(os.path.exists(SPEC), SPEC)
        self.assertTrue(os.path.abspath(sheepfold.__file__).startswith(
            os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))))


if __name__ == "__main__":
    unittest.main()
