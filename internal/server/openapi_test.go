package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/server"
)

func TestOpenAPIValid(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.json is not a valid OpenAPI document: %v", err)
	}
}

// TestOpenAPIErrorCodes checks that the ErrorCode enum is exactly the set
// of codes that have a status.
func TestOpenAPIErrorCodes(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas struct {
				ErrorCode struct {
					Enum []string `json:"enum"`
				} `json:"ErrorCode"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	got := doc.Components.Schemas.ErrorCode.Enum
	var want []string
	for c := range apierr.Status {
		want = append(want, string(c))
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("ErrorCode enum %v\nwant (apierr.Status) %v", got, want)
	}
}

// TestOpenAPIEventTypes checks that the EventType enum is exactly the
// types a filter or a webhook may name (events.Known), in their order.
func TestOpenAPIEventTypes(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas struct {
				EventType struct {
					Enum []string `json:"enum"`
				} `json:"EventType"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, tp := range events.Types() {
		want = append(want, string(tp))
	}
	if got := doc.Components.Schemas.EventType.Enum; len(got) == 0 || !slices.Equal(got, want) {
		t.Fatalf("EventType enum %v\nwant (events.Types) %v", got, want)
	}
	for _, tp := range want {
		if !events.Known(events.Type(tp)) {
			t.Errorf("%s is not known", tp)
		}
	}
	if events.Known("sandbox.exploded") || events.Known("") {
		t.Error("events.Known knows a type that is not one")
	}
}

// TestOpenAPIRoutes checks that every route the server registers is in
// the document, and every operation of the document is a route.
func TestOpenAPIRoutes(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for p, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+p)
		}
	}
	srv := server.New(server.Config{}, nil, nil, nil)
	defer srv.Shutdown(context.Background())
	routes := srv.Routes()
	sort.Strings(documented)
	sort.Strings(routes)
	if !slices.Equal(documented, routes) {
		for _, r := range routes {
			if !slices.Contains(documented, r) {
				t.Errorf("route %s is not in api/openapi.json", r)
			}
		}
		for _, d := range documented {
			if !slices.Contains(routes, d) {
				t.Errorf("operation %s of api/openapi.json is not served", d)
			}
		}
	}
	for _, r := range routes {
		method, _, _ := strings.Cut(r, " ")
		if !slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}, method) {
			t.Errorf("route %s has no method", r)
		}
	}
}
