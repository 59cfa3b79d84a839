#!/usr/bin/env python3
"""Black Friday support tickets, answered by a model that runs pandas in a Sheepfold session.

The orders export has duplicate orders (a payment retry charged some customers
twice). For each ticket the model writes code (a run_code tool call, or fenced
code as the seeds' models do), Sheepfold runs it in the session's sandbox under
its policy, and the answer comes back with the outputs, the charts, the tokens
and the time. Run it against a local server whose config lists a provider:

    SHEEPFOLD_API_KEY=sf_... SHEEPFOLD_URL=http://127.0.0.1:8080/v1 \\
    SHEEPFOLD_MODEL=deepseek-chat python3 examples/black_friday.py

--repeat N --concurrency C sends every ticket N times from C clients, each
with its own session, and prints Sheepfold's own time per ticket (everything
but the model's) at p50 and p95. Standard library and the SDK only.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

from sheepfold import Client, SheepfoldError  # noqa: E402

TICKETS = [
    "Total revenue per country in orders.csv, counting each order_id once.",
    "Make a stock chart per SKU from orders.csv as a PNG and name the SKUs low in stock.",
    "Find the duplicate orders in orders.csv (the same order_id twice).",
    "Draft an e-mail to the customer of the first duplicate order in orders.csv: we refunded the double charge.",
]

# What a session runs first: the tickets' libraries, and a first figure.
WARM_UP = """import pandas, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig = plt.figure()
fig.gca().plot([1, 2])
fig.canvas.draw()
plt.close(fig)"""


def orders_csv(n: int = 40, duplicates: int = 3, seed: int = 11) -> str:
    """A Black Friday orders export with a few orders charged twice."""
    rnd = random.Random(seed)
    countries = ["DE", "FR", "US", "NL", "ES"]
    skus = {"TV-55": 499.0, "HEADSET": 79.9, "LAPTOP": 899.0, "PHONE": 649.0, "CABLE": 9.99}
    stock = {sku: rnd.randint(2, 60) for sku in skus}
    rows = ["order_id,customer,email,country,sku,qty,price,stock"]
    for i in range(1, n + 1):
        sku = rnd.choice(list(skus))
        name = f"Customer {i}"
        rows.append(f"{1000 + i},{name},customer{i}@example.com,{rnd.choice(countries)},{sku},{rnd.randint(1, 3)},"
                    f"{skus[sku]},{stock[sku]}")
    for row in rnd.sample(rows[1:], duplicates):
        rows.append(row)  # the retry's second charge
    return "\n".join(rows) + "\n"


def percentile(values, p):
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="send every ticket this many times")
    ap.add_argument("--concurrency", type=int, default=1, help="clients at once, each with its own session")
    ap.add_argument("--out", default=os.environ.get("BLACK_FRIDAY_OUT", "black_friday_out"), help="where charts are saved")
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    args = ap.parse_args()

    client = Client(api_key=os.environ.get("SHEEPFOLD_API_KEY"),
                    base_url=os.environ.get("SHEEPFOLD_URL", "http://127.0.0.1:8080/v1"))
    model = os.environ.get("SHEEPFOLD_MODEL", "deepseek-chat")
    csv = orders_csv()
    os.makedirs(args.out, exist_ok=True)
    jobs = [t for _ in range(args.repeat) for t in TICKETS]
    lock = threading.Lock()
    own_ms, failed, charts = [], [], []

    def worker(w: int) -> None:
        try:
            work(w)
        except SheepfoldError as e:
            with lock:
                failed.append(f"client {w}: {e}")

    def work(w: int) -> None:
        session = client.sessions.create(model=model, sandbox_config={
            "allowed_modules": ["pandas", "numpy", "matplotlib", "csv", "math", "json"],
            "network_restricted": True})
        try:
            # Start the session's interpreter with the libraries the
            # tickets use (a cold pandas import and matplotlib's first figure,
            # its font cache, take seconds, more with several sessions
            # starting at once); not counted as a ticket.
            client.sandbox.execute(session_id=session.id, code=WARM_UP, timeout_ms=180000).raise_for_error()
            first = True
            while True:
                with lock:
                    if not jobs:
                        return
                    ticket = jobs.pop(0)
                try:
                    answer = client.sessions.ask(session_id=session.id, prompt=ticket,
                                                 files={"orders.csv": csv} if first else None)
                except SheepfoldError as e:
                    with lock:
                        failed.append(f"{ticket}: {e}")
                    continue
                first = False
                bad = [ex for ex in answer.executions if ex.status != "success"]
                with lock:
                    own_ms.append(answer.sheepfold_time_ms)
                    if bad or answer.stop_reason != "answered":
                        failed.append(f"{ticket}: {answer.stop_reason}, {[str(ex.error) for ex in bad]}")
                    for ex in answer.executions:
                        for png in ex.chart_bytes():
                            path = os.path.join(args.out, f"chart_{len(charts) + 1}.png")
                            with open(path, "wb") as f:
                                f.write(png)
                            charts.append(path)
                    if not args.quiet:
                        print(f"== {ticket}")
                        for ex in answer.executions:
                            print(ex.output.rstrip())
                        print(f"-- {answer.text.strip()}")
                        print(f"   time per ticket: {answer.time_ms:.0f} ms (Sheepfold {answer.sheepfold_time_ms:.0f} ms, "
                              f"model {answer.model_time_ms:.0f} ms), {answer.tokens.total_tokens} tokens, cost {answer.cost}")
        finally:
            client.sessions.delete(session.id)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(max(1, args.concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    print(f"{len(own_ms)} tickets in {wall:.1f} s, {len(failed)} failed; charts: {', '.join(charts) or 'none'}")
    print(f"Sheepfold's own time per ticket: p50 {percentile(own_ms, 50):.1f} ms, p95 {percentile(own_ms, 95):.1f} ms")
    for f in failed:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
