# Seed 000's client, as the article writes it ("Code prêt à copier :
# intégration HolySheep + E2B"), run against Sheepfold by test_e2b_python.py
# with the real E2B Python SDK (vendor/) and requests.
#
# What was changed from the article, and why (nothing else was):
#  1. The URL and the key: HOLYSHEEP_URL and HOLYSHEEP_KEY come from the
#     environment (the article's literals name its own service). The E2B
#     SDK reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY itself.
#  2. run_in_e2b takes orders.csv and uploads it before running the code:
#     the article's question asks the code to load orders.csv, which its
#     sandbox never receives.
#  3. The article's Sandbox(timeout=30) is E2B's old constructor: the
#     SDK's 2.x line refuses it (TypeError: unexpected keyword argument
#     'timeout'), against E2B itself too. Sandbox.create(timeout=30), the
#     form the article's own error 2 uses, is what it means.
#  4. strip_fence is the article's error 5 fix, whose regex lost a
#     backtick of each fence (``) on the page: three again here.

import os, requests, re
from e2b_code_interpreter import Sandbox

HOLYSHEEP_URL = os.environ["HOLYSHEEP_URL"]  # (1) "https://api.holysheep.ai/v1/chat/completions"
HOLYSHEEP_KEY = os.environ["HOLYSHEEP_KEY"]  # (1) "YOUR_HOLYSHEEP_API_KEY"

def llm_generate_code(prompt: str) -> str:
    payload = {
        "model": "deepseek-chat",
        "messages": [
            {"role": "system", "content": "Renvoie uniquement du Python exécutable, sans markdown."},
            {"role": "user", "content": prompt},
        ],
        "temperature": 0.1,
        "max_tokens": 600,
    }
    r = requests.post(
        HOLYSHEEP_URL,
        headers={"Authorization": f"Bearer {HOLYSHEEP_KEY}"},
        json=payload,
        timeout=15,
    )
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]

def run_in_e2b(code: str, orders_csv: bytes = b""):  # (2)
    with Sandbox.create(timeout=30) as sb:  # (3) Sandbox(timeout=30)
        if orders_csv:  # (2)
            sb.files.write("orders.csv", orders_csv)
        execution = sb.run_code(code)
        return {
            "stdout": execution.logs.stdout,
            "stderr": execution.logs.stderr,
            "results": [r.text for r in execution.results],
        }

# Error 5's fix, for a model that answers in a Markdown fence.  (4)
def strip_fence(code: str) -> str:
    return re.sub(r"^```(?:python)?\n|\n```$", "", code.strip(), flags=re.M)

if __name__ == "__main__":
    user_question = "Charge orders.csv et renvoie le CA total par pays."
    code = llm_generate_code(user_question)
    print(run_in_e2b(code))
