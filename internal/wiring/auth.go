package wiring

import (
	"fmt"
	"log/slog"

	"github.com/ackgate/ackgate/brokerauth"
	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/gate"
	"github.com/ackgate/ackgate/handlers"
	"github.com/ackgate/ackgate/storage"
)

var _ brokerauth.CertStore = (*storage.SNSCerts)(nil)

// brokerAuth builds the ingest listener's authenticators: the routes' shared
// secrets, read once here through getenv from the variables the routes name;
// one SNS verifier and one OIDC verifier for the process. The caller adds the
// log of SNS subscription messages once the pool is open.
func brokerAuth(s config.Settings, routes []*gate.Route, getenv func(string) string, log *slog.Logger) (handlers.BrokerAuth, error) {
	creds, err := config.ResolveCredentials(routes, getenv)
	if err != nil {
		return handlers.BrokerAuth{}, fmt.Errorf("routes: %w", err)
	}
	sns, err := brokerauth.NewSNSVerifier(brokerauth.SNSOptions{TrustedURLPrefixes: s.SNSTrustedURLPrefixes})
	if err != nil {
		return handlers.BrokerAuth{}, fmt.Errorf("settings: %s_SNS_TRUSTED_URL_PREFIXES: %w", config.EnvPrefix, err)
	}
	if len(s.SNSTrustedURLPrefixes) > 0 {
		log.Warn("SNS certificate and subscribe URLs under these prefixes are trusted besides SNS's own hosts; meant for emulators, never production",
			"prefixes", s.SNSTrustedURLPrefixes)
	}
	return handlers.BrokerAuth{
		OIDC:        brokerauth.NewOIDCVerifier(brokerauth.OIDCOptions{DefaultJWKSURL: s.OIDCJWKSURL}),
		SNS:         sns,
		Credentials: creds,

		ConfirmationMaxAge: s.SNSConfirmationMaxAge,
	}, nil
}
