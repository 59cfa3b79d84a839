package llmtest

import (
	"strings"
)

// Brain is a handler that plays a model for the SDKs' tests, the examples
// and the bench, following the conversation:
//
//   - after an execution (a tool message, or the session's "The code ran"
//     message) it answers "Result: " and the output;
//   - a prompt "RUN:\n<code>" calls run_code with the code; "FENCE:\n<code>"
//     answers with the code in a Python fence; "SAY: <text>" answers text;
//     "HANG" never answers;
//   - "How many distinct orders are in orders.csv?" (examples/session)
//     counts them with the csv module;
//   - a Black Friday ticket (examples/black_friday.py) gets the pandas code
//     an analyst would write, fenced, as the seeds' models answer;
//   - anything else gets "I cannot help with that."
func Brain(req Request) Reply {
	msgs := req.Chat.Messages
	if n := len(msgs); n > 0 {
		last := msgs[n-1]
		if last.Role == "tool" {
			return Text("Result: " + strings.TrimSpace(last.Content))
		}
		if out, ok := strings.CutPrefix(last.Content, "The code ran. Its output:\n"); ok && last.Role == "user" {
			out, _, _ = strings.Cut(out, "\nAnswer the question in plain text now")
			return Text("Result: " + strings.TrimSpace(out))
		}
	}
	prompt := ""
	for _, m := range msgs {
		if m.Role == "user" {
			prompt = m.Content
			break
		}
	}
	prompt, _, _ = strings.Cut(prompt, "\n\nFiles in /home/user:")
	switch {
	case strings.HasPrefix(prompt, "RUN:\n"):
		return RunCode(strings.TrimPrefix(prompt, "RUN:\n"))
	case strings.HasPrefix(prompt, "FENCE:\n"):
		return Fenced("python", strings.TrimPrefix(prompt, "FENCE:\n"))
	case strings.HasPrefix(prompt, "SAY: "):
		return Text(strings.TrimPrefix(prompt, "SAY: "))
	case prompt == "HANG":
		return Reply{Hang: true}
	}
	if strings.Contains(prompt, "distinct orders") {
		return RunCode("import csv\nprint(len({r['order_id'] for r in csv.DictReader(open('orders.csv'))}))")
	}
	if code, ok := blackFriday(prompt); ok {
		if sys := msgs[0]; sys.Role == "system" && strings.Contains(sys.Content, "sans markdown") {
			return Text(code) // "without markdown", as seed 000's system message asks
		}
		return Fenced("python", code)
	}
	return Text("I cannot help with that.")
}

// blackFriday is the code for each kind of ticket of the Black Friday
// example (orders.csv: order_id, customer, email, country, sku, qty,
// price, stock).
func blackFriday(prompt string) (string, bool) {
	p := strings.ToLower(prompt)
	const load = "import pandas as pd\ndf = pd.read_csv('orders.csv')\n"
	switch {
	case strings.Contains(p, "ca total par pays"):
		// Seed 000's question; its system message asks for bare Python.
		return load + `orders = df.drop_duplicates(subset="order_id")
print((orders.qty * orders.price).groupby(orders.country).sum().round(2).to_dict())`, true
	case strings.Contains(p, "revenue") && strings.Contains(p, "country"):
		return load + `orders = df.drop_duplicates(subset="order_id")
revenue = (orders.qty * orders.price).groupby(orders.country).sum().round(2)
for country, total in revenue.sort_values(ascending=False).items():
    print(f"{country}: {total:.2f}")`, true
	case strings.Contains(p, "stock") && strings.Contains(p, "chart"):
		return load + `import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
stock = df.drop_duplicates(subset="order_id").groupby("sku").stock.min()
stock.plot(kind="bar", title="stock left per SKU")
plt.tight_layout()
plt.show()
print("low stock:", ", ".join(stock[stock < 10].index) or "none")`, true
	case strings.Contains(p, "e-mail") || strings.Contains(p, "email"):
		return load + `dups = df[df.duplicated(subset="order_id", keep="first")]
row = dups.iloc[0] if len(dups) else df.iloc[0]
print(f"To: {row.email}\nSubject: Your Black Friday order {row.order_id}\n\n"
      f"Dear {row.customer},\n\nyour order {row.order_id} was charged twice; "
      f"we have refunded {row.qty * row.price:.2f}.\n\nKind regards,\nSupport")`, true
	case strings.Contains(p, "duplicate"):
		return load + `dups = df[df.duplicated(subset="order_id", keep="first")]
print(f"{len(dups)} duplicate orders:", ", ".join(str(i) for i in dups.order_id))`, true
	}
	return "", false
}
