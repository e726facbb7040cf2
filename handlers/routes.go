package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// The whole HTTP surface, one listener per function, so a reader (and the
// openapi.yaml test) sees every path in one place.

func addIngestRoutes(r chi.Router, o *IngestOptions) {
	r.Get("/healthz", handleHealthz())
	r.Get("/readyz", handleReadyz(o))
	r.Post("/v1/push/pubsub/{route}", handlePubSubPush(o))
	r.Post("/v1/push/sns/{route}", handleSNSPush(o))
}

func addAdminRoutes(r chi.Router, o *AdminOptions) {
	r.Group(func(r chi.Router) {
		r.Use(o.requireCredential(false))
		r.Get("/v1/operations", handleListOperations(o))
		r.Get("/v1/operations/{id}", handleGetOperation(o))
		r.Post("/v1/operations/{id}/resolve", handleResolve(o))
		r.Post("/v1/operations/{id}/replay", handleReplay(o))
		r.Post("/v1/outbox/{id}/retry", handleOutboxRetry(o))
		r.Post("/v1/outbox/{id}/cancel", handleOutboxCancel(o))
		r.Get("/v1/dead-letters", handleListDeadLetters(o))
		r.Get("/v1/routes", handleListRoutes(o))
		r.Get("/v1/routes/{name}", handleGetRoute(o))
		r.Get("/v1/poison", handleListPoison(o))
	})
	// A scraper may hold the metrics token, which opens nothing but this.
	r.With(o.requireCredential(true)).Method(http.MethodGet, "/metrics", o.Metrics)
}
