// Package loom names the endpoint contract that runbudget's admission
// middleware is written against. The names are aliases of Goa's own types, so
// a Goa-generated service passes its endpoints to admission (for instance
// through the generated Endpoints.Use) with no adapter in between.
package loom

import goa "goa.design/goa/v3/pkg"

// Endpoint is one unary service method, transport-independent: Goa's
// goa.Endpoint under a local name.
type Endpoint = goa.Endpoint

// ServiceError is the error a service returns to its transport layer, which
// maps it by Name (to an HTTP status, for example): Goa's goa.ServiceError
// under a local name.
type ServiceError = goa.ServiceError
