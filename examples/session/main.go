// Command session is the Go example of a model session: it creates a
// session under a policy, runs code in it, asks the model a question about
// a CSV file and prints the answer with its executions, tokens and time.
//
//	SHEEPFOLD_API_KEY=sf_... SHEEPFOLD_URL=http://127.0.0.1:8080 SHEEPFOLD_MODEL=deepseek-chat \
//	    go run ./examples/session
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/sheepfold/sheepfold/client"
)

const orders = "order_id,country,qty,price\n1,DE,2,10\n2,FR,1,20\n3,DE,1,5\n3,DE,1,5\n"

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "session:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	url := strings.TrimSuffix(strings.TrimRight(envOr("SHEEPFOLD_URL", "http://127.0.0.1:8080"), "/"), "/v1")
	c := client.New(url, os.Getenv("SHEEPFOLD_API_KEY"))
	s, err := c.CreateSession(ctx, client.SessionRequest{Model: envOr("SHEEPFOLD_MODEL", "deepseek-chat"),
		SandboxConfig: map[string]any{"allowed_modules": []string{"csv", "json", "math"}, "network_restricted": true}})
	if err != nil {
		return err
	}
	defer c.DeleteSession(context.WithoutCancel(ctx), s.ID)
	fmt.Println("session", s.ID, "model", s.Model)

	ex, err := c.SessionExecute(ctx, s.ID, client.SessionExecuteRequest{Code: "import os", TimeoutMS: 10000})
	if err != nil {
		return err
	}
	var execErr *client.ExecutionError
	if errors.As(ex.Err(), &execErr) {
		fmt.Printf("blocked: %s %s\n", execErr.Code, execErr.Message)
	}

	ans, err := c.AskStream(ctx, s.ID, client.AskRequest{
		Prompt: "How many distinct orders are in orders.csv? Use the csv module.",
		Files:  []client.AskFile{client.TextFile("orders.csv", orders)},
	}, func(st client.AskStep) {
		if st.Execution != nil {
			fmt.Printf("step %d ran: %s", st.Step, st.Execution.Output)
		}
	})
	if err != nil {
		return err
	}
	fmt.Printf("answer: %s\n%d executions, %d tokens, %.0f ms (Sheepfold %.0f ms), cost %s\n", ans.Text,
		len(ans.Executions), ans.Tokens.TotalTokens, ans.TimeMS, ans.SheepfoldTimeMS, ans.Cost)
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
