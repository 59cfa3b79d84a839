// Package api holds the OpenAPI document of the REST API (openapi.json),
// the source of truth for the /v1 surface, embedded for serving at
// /v1/openapi.json.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the /v1 API.
//
//go:embed openapi.json
var OpenAPI []byte
