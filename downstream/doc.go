// Package downstream makes the calls the gate decides on: the effect request
// itself and, for lookup routes, the question "does the effect for this key
// exist?". It implements gate.Effects.
//
// The package's one hard rule is that every request it puts on the wire is one
// the gate decided and recorded as an attempt. net/http would otherwise resend
// a POST carrying an Idempotency-Key on its own when a reused connection breaks
// before the response; against a provider without dedupe that is a second
// effect the ledger never saw. See newEffectRequest for how that is prevented.
//
// Answers are sorted into gate outcomes in one place (classify.go) so that the
// rule "unknown unless proven otherwise" is easy to audit: only a request that
// provably never reached a connection is retryable without the provider saying
// so.
package downstream
