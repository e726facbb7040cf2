package wiring

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/console"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/internal/admincred"
	"github.com/ackgate/ackgate/internal/authlimit"
	"github.com/ackgate/ackgate/storage"
	"github.com/ackgate/ackgate/telemetry"
)

var (
	_ console.SessionStore        = (*storage.ConsoleSessions)(nil)
	_ console.Ledger              = (*storage.Ledger)(nil)
	_ console.Resolver            = (*gate.Gate)(nil)
	_ console.PoisonStore         = (*storage.PoisonLog)(nil)
	_ console.OutboxActions       = (*storage.Ledger)(nil)
	_ console.AuthFailureRecorder = (*telemetry.Metrics)(nil)
)

// withConsole puts the operator console beside the admin API on the admin
// listener, under /console/, when the settings enable it; every other path
// still goes to admin, unchanged.
func withConsole(s config.Settings, routes []*gate.Route, log *slog.Logger, m *telemetry.Metrics, g *Gateway, admin http.Handler,
	creds *admincred.Set, limiter *authlimit.Limiter) (http.Handler, error) {
	if !s.ConsoleEnabled {
		return admin, nil
	}
	c, err := console.New(console.Options{
		Credentials: creds, Sessions: storage.NewConsoleSessions(g.Redis), AuthLimiter: limiter,
		Ledger: g.Ledger, Resolver: g.Gate, Poison: g.Poison, Outbox: g.Ledger, Routes: routes, Logger: log,
		AuthFailures: m, TraceURL: s.ConsoleTraceURL, SessionTTL: s.ConsoleSessionTTL, AllowHTTP: s.ConsoleAllowHTTP,
	})
	if err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	return console.Mount(admin, c), nil
}
