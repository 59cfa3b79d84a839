package server_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// BenchmarkPreview: small keep-alive GETs to an app on the host's
// loopback, straight (Direct) and through the preview path form (the
// server, the agent's port forward; the fake runtime runs the agent on
// the host). The difference is the preview's overhead per request; run
// with -cpuprofile to see where it goes.
func BenchmarkPreview(b *testing.B) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go app.Serve(ln)
	b.Cleanup(func() { app.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	e := newEnv(b, server.Config{})
	id := e.create(e.keyA, nil)
	tok := e.ports(e.keyA, id, "").Token
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(hc.CloseIdleConnections)
	run := func(b *testing.B, url string, hdr ...string) {
		get := func() {
			req, _ := http.NewRequest("GET", url, nil)
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			r, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusOK || string(body) != "ok" {
				b.Fatalf("%d %q", r.StatusCode, body)
			}
		}
		get()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				get()
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	}
	b.Run("Direct", func(b *testing.B) { run(b, "http://127.0.0.1:"+strconv.Itoa(port)+"/") })
	b.Run("Proxied", func(b *testing.B) {
		run(b, e.url+"/v1/sandboxes/"+id+"/proxy/"+strconv.Itoa(port)+"/", "Sheepfold-Preview-Token", tok)
	})
}
