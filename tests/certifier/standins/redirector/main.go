// The golang-middleware template's main, as the certifier's theaxer/redirector image runs it:
// an HTTP server whose only handler is the function's Handle (functions/redirector/handler.go of
// the certifier, copied in as function/handler.go at build time), behind the watchdog in http
// mode. One difference: the template listens on the fixed port 8082; here the port comes from
// upstream_url, which faas-gpu's Docker runtime gives every replica (host network: one port each).
package main

import (
	"log"
	"net/http"
	"net/url"
	"os"
	"time"

	"handler/function"
)

func main() {
	port := "8082"
	if raw := os.Getenv("upstream_url"); raw != "" {
		if u, err := url.Parse(raw); err == nil && u.Port() != "" {
			port = u.Port()
		}
	}
	s := &http.Server{
		Addr:           "127.0.0.1:" + port,
		ReadTimeout:    10 * time.Second,
		WriteTimeout:   10 * time.Second,
		MaxHeaderBytes: 1 << 20,
		Handler:        http.HandlerFunc(function.Handle),
	}
	log.Printf("Listening on %s", s.Addr)
	log.Fatal(s.ListenAndServe())
}
