// Package config loads ackgate's two kinds of configuration: process settings
// from GATEWAY_* environment variables, and routes from one YAML file. Both are
// validated before anything starts; an invalid routes file is reported in
// full, every problem naming its route and field, for example
//
//	route "orders": effect.url: "ftp://x" must be an absolute http(s) URL
//
// # Process settings
//
// LoadSettings reads these variables (Usage prints the same table):
//
//	GATEWAY_DATABASE_URL          postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable
//	GATEWAY_REDIS_URL             redis://127.0.0.1:6379/0
//	GATEWAY_REDIS_ADDRS           Sentinel or Cluster addresses, comma-separated
//	GATEWAY_REDIS_MASTER_NAME     Sentinel master; with REDIS_ADDRS selects Sentinel
//	GATEWAY_REDIS_SENTINEL_PASSWORD
//	GATEWAY_REDIS_CLUSTER         false; true treats a single REDIS_ADDRS entry as a Cluster seed
//	GATEWAY_ROUTES_FILE           required by serve and check-config
//	GATEWAY_LISTEN_ADDR           :8080 (ingest)
//	GATEWAY_ADMIN_ADDR            :8081 (admin API; must differ from the ingest listener)
//	GATEWAY_ADMIN_TOKEN           required by serve, at least 16 characters
//	GATEWAY_MAX_BODY_BYTES        1048576 (1 MiB)
//	GATEWAY_READ_HEADER_TIMEOUT   5s
//	GATEWAY_READ_TIMEOUT          30s
//	GATEWAY_WRITE_TIMEOUT         60s; must exceed every route's ack_deadline
//	GATEWAY_IDLE_TIMEOUT          120s
//	GATEWAY_SHUTDOWN_TIMEOUT      25s, inside Kubernetes' default 30 s grace period
//	GATEWAY_MAX_CLOCK_SKEW        5m (at most 24h); a Pub/Sub publishTime further ahead
//	                              of this gateway's clock is malformed
//	GATEWAY_KEY_HASH_SECRET       required (at least 32 characters) when a route keys
//	                              on a private field: the secret of the key's HMAC
//	GATEWAY_OIDC_JWKS_URL         https://www.googleapis.com/oauth2/v3/certs (keys of Pub/Sub push tokens)
//	GATEWAY_SNS_TRUSTED_URL_PREFIXES
//	                              empty; SNS emulators only: URL prefixes (ending in /)
//	                              trusted for SigningCertURL and SubscribeURL
//	GATEWAY_LOG_LEVEL             info (debug, info, warn, error)
//	GATEWAY_INSTANCE_ID           the host name
//
// Redis topology follows go-redis's UniversalClient: REDIS_URL alone is a
// standalone server; REDIS_ADDRS with REDIS_MASTER_NAME is Sentinel; several
// REDIS_ADDRS (or REDIS_CLUSTER=true) is Cluster. With REDIS_ADDRS set, the
// URL still supplies username, password, database and TLS (rediss://).
//
// The body limit of 1 MiB covers SNS (256 KiB messages) and typical Pub/Sub
// messages. A Pub/Sub message arrives base64-encoded, so raise the limit to
// about 1.4 times the largest message a route carries: a push larger than the
// limit is refused, which Pub/Sub treats as a nack.
//
// # Routes file
//
// The file holds one top-level list, routes:. Unknown fields anywhere are
// errors, so a misspelt policy never silently falls back to its default.
// Durations are Go duration strings ("10s", "168h"). Fields and defaults:
//
//	name              required; a-z, 0-9, '-', '_', at most 63; unique
//	tenant            "default"
//	broker            required: pubsub | sns
//	auth              required: none | oidc (pubsub) | sns_signature | basic (sns);
//	                  every route with none is reported by AuthNoneWarnings
//	oidc              auth: oidc only: audience, service_account (the push
//	                  subscription's), jwks_url (GATEWAY_OIDC_JWKS_URL)
//	verification_token_env
//	                  pubsub only, off by default: the environment variable
//	                  holding the legacy ?token= value, checked as well
//	basic_auth        auth: basic only: username_env, password_env
//	pubsub_mode       pubsub: wrapped (default) | unwrapped (payload unwrapping
//	                  with write metadata)
//	raw_delivery      sns: false; true only with auth: basic, since raw
//	                  messages carry no signature
//	sources           subscriptions (projects/P/subscriptions/S) or topic ARNs;
//	                  empty accepts any, but sns_signature and basic routes
//	                  must list their topics, and SNS subscriptions are
//	                  confirmed only for listed topics. FIFO topics are
//	                  refused: SNS cannot deliver them over HTTP.
//	operation_key     kind: message_id (default) | attribute | json_pointer;
//	                  name: the attribute, or the pointer ("/order/id");
//	                  sns: not attribute (see below)
//	fingerprint       version: 1, data: true, attributes: [], pointers: [];
//	                  sns: no attributes
//	effect.method     POST
//	effect.url        required; absolute http(s)
//	effect.body_mode  raw | envelope | cloudevent | cloudevent_binary; default
//	                  raw: the message data, its attributes as
//	                  X-Ackgate-Attr-<name> headers (percent-encoded);
//	                  envelope: the push request as received; cloudevent:
//	                  a CloudEvents 1.0 structured event; cloudevent_binary:
//	                  the same event in binary mode (data as the body, ce-*
//	                  headers). A CloudEvent carries the attributes as
//	                  extensions (see downstream.extensionNames for names)
//	effect.headers    extra headers; the gateway's own (Idempotency-Key, Host,
//	                  Content-Length, ...) cannot be set
//	effect.timeout    5s; at most ack_deadline + renewal.max_extension
//	effect.result_id_header, effect.result_id_pointer
//	                  where a 2xx carries the provider's result id
//	effect.evidence   result_id when a result id header or pointer is set;
//	                  otherwise required: status_only (see below)
//	effect.retryable_statuses
//	                  [408, 425, 429, 500, 502, 503, 504]
//	effect.terminal_statuses
//	                  [400, 401, 403, 404, 410, 422]
//	effect.lookup_url required for shape lookup, optional for handoff (the
//	                  relay asks it after a lost response); contains {key}
//	shape             required: idempotent | lookup | unsafe | repeatable |
//	                  handoff | local
//	dedupe_window     required for shape idempotent; optional for handoff
//	                  (the relay retries a lost response inside it)
//	local             shape local only, which has no effect: block:
//	  .sql            the statement, run in the ledger's database in the
//	                  transaction that records its evidence; its one
//	                  returned value is the result id
//	  .params         bound in order to $1, $2, ...: data_json, data_bytes,
//	                  idempotency_key, operation_id, message_id,
//	                  attribute:NAME (absent: the message is malformed) or
//	                  attribute?:NAME (absent: NULL); must match the
//	                  statement's placeholders
//	  .role           optional; SET LOCAL ROLE for the statement only; checked
//	                  at start (exists, may be taken, can run the statement)
//	  .timeout        5s; at most ack_deadline + renewal.max_extension; past
//	                  it the statement is rolled back and the delivery nacked
//	handoff           shape handoff only: retry_min 1s, retry_max 5m, the
//	                  relay's backoff after a pass that left the effect open.
//	                  A handoff route's effect.timeout bounds the relay's call
//	                  (at most 1h), not the broker's deadline; dead_letter
//	                  must be gateway; body_mode envelope is refused
//	reconcile         lookup (and handoff with a lookup_url): interval 30s (1s to 24h), max_interval 15m
//	                  (at least interval), rate_per_second 5 (per replica,
//	                  at most 1000); how the reconciler works the route's
//	                  indeterminate lane
//	max_attempts      5 (1 to 100); counts every call to the downstream,
//	                  effect calls and lookups alike
//	dead_letter       broker | gateway; default broker
//	ack_deadline      pubsub: 10s (10s to 600s, the subscription's value);
//	                  sns: always 15s
//	renewal.interval  ack_deadline / 3; must be shorter than ack_deadline
//	renewal.max_extension
//	                  pubsub: ack_deadline; sns: 0
//	broker_retention  pubsub only: the subscription's message retention,
//	                  7 days by default (10m to 31 days)
//	retention         pubsub: broker_retention + 1 day (8 days by default);
//	                  sns: 2h
//	private           attribute names, and JSON pointers into the data
//	                  (starting with /), never stored or logged
//
// Why these defaults:
//
//   - The message id is the only key every message has, and both brokers keep
//     it stable across redeliveries. Fingerprinting the data by default means a
//     reused key with a different payload is caught as a conflict.
//   - Only responses that reliably mean "nothing happened" are retryable, and
//     only responses a retry cannot change are terminal. Any other status is
//     unknown and goes through the route's shape (dedupe, lookup or operator).
//     Listing a status explicitly in one list removes it from the other list's
//     default; listing it in both is an error. A 2xx can be in neither.
//   - Five attempts ride out a brief downstream outage without turning a
//     message that can never succeed into an endless retry loop.
//   - dead_letter defaults to broker so that nothing is acked unless the
//     effect happened, unless a route opts into the gateway's dead-letter
//     table.
//   - The lease follows the broker: Pub/Sub's default ack deadline is 10 s and
//     SNS waits 15 s. Renewing every third of the deadline leaves two chances
//     before the lease lapses. Pub/Sub may extend by one more deadline so a slow
//     call keeps its owner while the broker redelivers; SNS's timeout is fixed,
//     so the default there is no extension.
//   - Evidence must outlive every redelivery of the same message, or a late
//     redelivery looks new and runs the effect again. Pub/Sub can redeliver for
//     as long as the subscription retains messages (7 days by default, up to
//     31), so retention defaults to that plus a day and may never be shorter.
//     SNS retries an HTTP/S delivery for at most an hour, whatever the
//     subscription's delivery policy (a hard limit of 3,600 s), and the last
//     retry may take its 15 s timeout: 2 h is kept and 1 h 15 s is the minimum.
//   - A lookup route's indeterminate operations are asked about in the
//     background, first half a minute after they entered the lane (time for
//     a lost response's effect to land), then at doubling intervals up to a
//     quarter of an hour while the lookup cannot tell, and at most five a
//     second per replica, so a lane of thousands never becomes a burst at a
//     provider that is already failing.
//
// Secrets (verification tokens, basic credentials) are never written in the
// routes file: a route names the environment variables that hold them,
// ResolveCredentials reads them once at start, and only the names are part of
// the route's contract and of GET /v1/routes.
//
// A bare 2xx is weak evidence: it says the downstream answered, not which
// effect it applied. A route that names no result id must therefore write
// effect.evidence: status_only, so that the choice is visible in the file, in
// its contract (GET /v1/routes) and in every completion statement, instead of
// following silently from two omitted fields.
//
// On SNS routes the operation key and the fingerprint come only from fields
// the SNS signature covers: the message id, or the Message (data, or JSON
// pointers into it). SNS does not sign MessageAttributes, so a captured
// message replayed with an attribute changed would still verify; were that
// attribute the key or part of the fingerprint, the replay would become a new
// operation. Such routes are refused at start.
//
// Private fields may still appear in fingerprint.attributes and
// fingerprint.pointers, since only a hash of them is kept. They may also be
// the operation key: such a key (operation_key.name listed in private) is kept
// only as its HMAC-SHA256 under GATEWAY_KEY_HASH_SECRET, and the contract says
// so (operation_key.hashed). A keyed hash, unlike a plain one, cannot be
// checked against guesses (an email address, a payment id) without the
// secret. Changing the secret changes every such key, so a redelivery after
// the change is taken for a new message.
//
// # Contract version
//
// Each route is stamped with ContractVersion: the first 16 hex digits of the
// SHA-256 of its JSON encoding after defaults, with lists whose order has no
// meaning sorted (sources, attributes, statuses, private) and header names
// canonicalised. Reordering such a list keeps the version; changing any
// setting changes it. broker_retention is a start-up check only and is not
// part of the contract.
package config
