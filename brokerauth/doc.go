// Package brokerauth decides whether a push request really comes from the
// broker a route names: Amazon SNS message signatures (with the certificate
// and subscription URLs they point at), Google Pub/Sub push OIDC tokens, a
// legacy Pub/Sub verification token and HTTP basic credentials.
//
// It is a package of its own, apart from the HTTP handlers, because it is the
// security boundary of the gateway: everything it accepts is executed. It
// knows nothing about routing, the ledger or status codes; it answers "yes",
// "no" or "cannot tell right now", and the handlers turn that into a status.
// Keeping it small and free of HTTP routing lets it be tested against real
// AWS-signed vectors and fuzzed on its own.
//
// # Failures
//
// Every failure is an *Error whose Kind says what the caller may do with it:
//
//   - Unauthenticated: no credential, or one that does not verify (bad
//     signature, unknown key, expired token, wrong issuer).
//   - Forbidden: the credential verifies but is not good for this route
//     (another audience or service account, an unverified email), or a message
//     points at a URL outside the allow-list.
//   - Malformed: the request is not the broker's message format at all.
//   - Unavailable: the credential cannot be checked right now because a
//     certificate or key set cannot be fetched (no connection, a 5xx). This
//     is the only kind that is not the sender's fault, and the only one that
//     must be answered with a retryable status: SNS drops a message on any
//     4xx. A certificate URL that answers 404 or 403 is not "cannot tell":
//     no genuine message names it, so the message is Unauthenticated.
//
// # URLs the gateway fetches because a message said so
//
// An SNS message names its signing certificate (SigningCertURL) and, for a
// subscription confirmation, the URL to GET to confirm it (SubscribeURL). Both
// are checked before any request is made: https, a host matching
// ^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$, and for certificates a path ending
// in .pem. Redirects are never followed. Other URL prefixes (an SNS emulator on
// localhost) are trusted only when configured explicitly; nothing is trusted
// by default beyond the AWS pattern.
//
// Within the allow-list a message still chooses the URL, so the certificate
// cache bounds what messages can make the gateway fetch: one fetch at a time
// per URL, failures remembered for a few seconds, and a budget of fetches per
// host and in all per minute (see SNSOptions).
package brokerauth
