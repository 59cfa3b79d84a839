// Package api holds the OpenAPI document of the REST API (openapi.json),
// the source of truth for the /v1 surface, embedded for serving at
// /v1/openapi.json.
//
// The document is the one wire vocabulary: the server's types, the Go
// SDK's (client/) and the Python SDK's models are each checked against
// it field for field (internal/testutil/apispec; the Python SDK's
// tests/test_spec.py), so none of the three can drift from it. It is
// the source rather than generated from Go types because it carries
// what they do not (descriptions, enums, bounds), and because the SDKs
// import nothing of the server: the Go SDK only the standard library,
// the Python SDK nothing.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the /v1 API.
//
//go:embed openapi.json
var OpenAPI []byte
