// Command echo is the workload image of the test cluster's smoke test
// (test/kubernetes/smoke.sh): a static HTTP server that answers every
// request with the pod's name and address, so that the caller can tell which
// pod answered. With ?get=URL it fetches URL itself and returns that answer,
// which is how the smoke test checks pod-to-pod reachability without a
// client program in the image.
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"
)

func main() {
	addr := ":8080"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	name := os.Getenv("POD_NAME")
	client := &http.Client{Timeout: 5 * time.Second}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		target := r.URL.Query().Get("get")
		if target == "" {
			fmt.Fprintf(w, "pod=%s ip=%s\n", name, os.Getenv("POD_IP"))
			return
		}
		resp, err := client.Get(target)
		if err != nil {
			http.Error(w, fmt.Sprintf("get %s: %v", target, err), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, io.LimitReader(resp.Body, 1<<20))
	})
	log.Printf("echo %s listening on %s", name, addr)
	log.Fatal(http.ListenAndServe(addr, nil))
}
