#!/usr/bin/env python3
"""Seed 000's batch workload on Sheepfold: score documents against a
canonical query, as its Modal function does with a cross-encoder on a
T4 (`@app.function(gpu="T4", timeout=600, memory=16384)`), here on CPU
with a small function in place of the model (a term-overlap relevance
score), run remotely over every document with sheepfold.function's .map:
one batch, concurrency 8, each worker keeping its sandbox.

    SHEEPFOLD_API_KEY=sf_... SHEEPFOLD_URL=http://127.0.0.1:8080 \\
    python3 examples/batch_score.py --docs 200

It prints the time and rate, the best-scored documents, checks every
remote score against the same function run here, and prints what the
batch used and cost.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import sheepfold  # noqa: E402

# The canonical query and its synonyms (the seed asks a model for five
# synonyms of "facture"): shipped with the function as a literal.
QUERY_TERMS = ("facture", "invoice", "bill", "receipt", "statement", "refund")


def server_url() -> str:
    # The examples' SHEEPFOLD_URL may end in /v1 (the OpenAI-style base);
    # the SDK's batch calls add it themselves.
    url = os.environ.get("SHEEPFOLD_URL", "http://127.0.0.1:8080").rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


# gpu="T4" and memory=16384 in the seed; a small CPU function needs neither.
@sheepfold.function(timeout=600, memory_mb=512, concurrency=8, base_url=server_url())
def score_document(doc):
    """Relevance of doc to the query: query terms found (with a bonus for
    the first), damped by the document's length, in [0, 1)."""
    import math
    import re
    words = re.findall(r"[a-zà-ÿ]+", doc.lower())
    if not words:
        return 0.0
    hits = sum(1 for w in words if w in QUERY_TERMS)
    first = 1.0 if words and words[0] in QUERY_TERMS else 0.0
    raw = hits + 0.5 * first
    return round(raw / (raw + math.log(1 + len(words))), 6)


def documents(n: int, seed: int = 11) -> list:
    rnd = random.Random(seed)
    topics = ["order", "delivery", "stock", "invoice", "refund", "chart", "customer", "payment", "bill", "csv"]
    filler = ["please", "check", "the", "my", "for", "last", "week", "again", "thanks", "urgent"]
    out = []
    for i in range(n):
        k = 3 + i % 9
        out.append(" ".join(rnd.choice(topics if j % 2 == 0 else filler) for j in range(k)) + f" #{i}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=200, help="documents to score")
    ap.add_argument("--top", type=int, default=3, help="best-scored documents to print")
    args = ap.parse_args()

    docs = documents(args.docs)
    t = time.monotonic()
    scores = list(score_document.map(docs))
    secs = time.monotonic() - t
    b = score_document.last_batch
    print(f"scored {len(scores)} documents in {secs:.1f} s ({len(scores) / secs:.1f} docs/s), {b.failed} failed")
    for s, d in sorted(zip(scores, docs), reverse=True)[:args.top]:
        print(f"  {s:.3f}  {d}")
    local = [score_document(d) for d in docs]  # the same function, run here
    print("remote scores match local:", scores == local)
    u = b.usage
    print(f"usage: {u.sandboxes} sandboxes, {u.executions} executions, {u.cpu_seconds:.2f} CPU-s, "
          f"{u.gb_seconds_reserved:.2f} GB-s, cost {u.cost}")
    one = score_document.remote("Invoice and refund for my last bill")
    print(f"one call: {one:.3f}")
    return 0 if scores == local and b.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
