{{/*
Names and labels.
*/}}
{{- define "ackgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ackgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A name derived from the full name with a suffix, kept within 63 characters. */}}
{{- define "ackgate.suffixed" -}}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "ackgate.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "ackgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ackgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ackgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ackgate.labels" -}}
helm.sh/chart: {{ include "ackgate.chart" . }}
{{ include "ackgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ackgate
{{- end }}

{{/* The gateway pods, and only they, carry component=gateway. */}}
{{- define "ackgate.podSelectorLabels" -}}
{{ include "ackgate.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "ackgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ackgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ackgate.image" -}}
{{- $repo := required "image.repository is required: build the image from the repository's Dockerfile, push it, and name it here" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Secrets. Each secret setting comes either from an existing Secret or from a
value the chart stores in its own Secret (named like the release). The helpers
below return "name/key" of where the setting lives, or "" when it is not set.
*/}}
{{- define "ackgate.secretName" -}}
{{- include "ackgate.fullname" . }}
{{- end }}

{{/* (list ctx value existingSecret existingSecretKey chartKey setting) */}}
{{- define "ackgate.secretRef" -}}
{{- $ctx := index . 0 }}
{{- $value := index . 1 }}
{{- $existing := index . 2 }}
{{- $existingKey := index . 3 }}
{{- $chartKey := index . 4 }}
{{- $setting := index . 5 }}
{{- if and $value $existing }}
{{- fail (printf "%s: set the value or existingSecret, not both" $setting) }}
{{- end }}
{{- if $existing }}
{{- printf "%s/%s" $existing $existingKey }}
{{- else if $value }}
{{- printf "%s/%s" (include "ackgate.secretName" $ctx) $chartKey }}
{{- end }}
{{- end }}

{{- define "ackgate.databaseRef" -}}
{{- include "ackgate.secretRef" (list . .Values.database.url .Values.database.existingSecret .Values.database.existingSecretKey "database-url" "database") }}
{{- end }}

{{- define "ackgate.redisURLRef" -}}
{{- include "ackgate.secretRef" (list . .Values.redis.url .Values.redis.existingSecret .Values.redis.existingSecretKey "redis-url" "redis") }}
{{- end }}

{{- define "ackgate.sentinelPasswordRef" -}}
{{- include "ackgate.secretRef" (list . .Values.redis.sentinel.password .Values.redis.sentinel.existingSecret .Values.redis.sentinel.existingSecretKey "redis-sentinel-password" "redis.sentinel") }}
{{- end }}

{{- define "ackgate.adminTokenRef" -}}
{{- include "ackgate.secretRef" (list . .Values.adminToken.value .Values.adminToken.existingSecret .Values.adminToken.existingSecretKey "admin-token" "adminToken") }}
{{- end }}

{{- define "ackgate.metricsTokenRef" -}}
{{- include "ackgate.secretRef" (list . .Values.metricsToken.value .Values.metricsToken.existingSecret .Values.metricsToken.existingSecretKey "metrics-token" "metricsToken") }}
{{- end }}

{{- define "ackgate.adminTokensRef" -}}
{{- include "ackgate.secretRef" (list . .Values.adminTokens.value .Values.adminTokens.existingSecret .Values.adminTokens.existingSecretKey "admin-tokens" "adminTokens") }}
{{- end }}

{{- define "ackgate.outboxKeyRef" -}}
{{- include "ackgate.secretRef" (list . .Values.outboxKey.value .Values.outboxKey.existingSecret .Values.outboxKey.existingSecretKey "outbox-key" "outboxKey") }}
{{- end }}

{{- define "ackgate.outboxOldKeysRef" -}}
{{- include "ackgate.secretRef" (list . .Values.outboxOldKeys.value .Values.outboxOldKeys.existingSecret .Values.outboxOldKeys.existingSecretKey "outbox-old-keys" "outboxOldKeys") }}
{{- end }}

{{- define "ackgate.keyHashSecretRef" -}}
{{- include "ackgate.secretRef" (list . .Values.keyHashSecret.value .Values.keyHashSecret.existingSecret .Values.keyHashSecret.existingSecretKey "key-hash-secret" "keyHashSecret") }}
{{- end }}

{{/* True (non-empty) when the chart has to create its own Secret. */}}
{{- define "ackgate.needsSecret" -}}
{{- $v := .Values }}
{{- if or (and $v.database.url (not $v.database.existingSecret)) (and $v.redis.url (not $v.redis.existingSecret)) (and $v.redis.sentinel.password (not $v.redis.sentinel.existingSecret)) (and $v.adminToken.value (not $v.adminToken.existingSecret)) (and $v.metricsToken.value (not $v.metricsToken.existingSecret)) (and $v.keyHashSecret.value (not $v.keyHashSecret.existingSecret)) (and $v.adminTokens.value (not $v.adminTokens.existingSecret)) (and $v.outboxKey.value (not $v.outboxKey.existingSecret)) (and $v.outboxOldKeys.value (not $v.outboxOldKeys.existingSecret)) }}true{{- end }}
{{- end }}

{{/*
An env entry read from a secret reference "name/key"; nothing when the
reference is empty (only under `helm lint`, where the checks in
ackgate.validate do not stop the rendering).
*/}}
{{- define "ackgate.secretEnv" -}}
{{- $name := index . 0 }}
{{- $ref := index . 1 }}
{{- if $ref }}
{{- $parts := splitList "/" $ref -}}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ index $parts 0 }}
      key: {{ index $parts 1 }}
{{- end }}
{{- end }}

{{/*
Checks that span several values (the schema checks each value alone). Renders
nothing; fails the release with a message naming the value.
*/}}
{{- define "ackgate.validate" -}}
{{- $v := .Values }}
{{- if not (include "ackgate.databaseRef" .) }}
{{- fail "database: set database.url or database.existingSecret (the ledger's Postgres URL)" }}
{{- end }}
{{- if not (or (include "ackgate.adminTokenRef" .) (include "ackgate.adminTokensRef" .)) }}
{{- fail "adminToken: set adminToken.value or adminToken.existingSecret (the admin API's bearer token), or adminTokens (named credentials)" }}
{{- end }}
{{- if and $v.serviceMonitor.enabled (not (include "ackgate.metricsTokenRef" .)) (not (include "ackgate.adminTokenRef" .)) }}
{{- fail "serviceMonitor: needs metricsToken (or adminToken) for Prometheus to present" }}
{{- end }}
{{- if and (include "ackgate.outboxOldKeysRef" .) (not (include "ackgate.outboxKeyRef" .)) }}
{{- fail "outboxOldKeys: set only with outboxKey: old keys open what the current key's predecessors sealed" }}
{{- end }}
{{- if and (eq $v.redis.mode "standalone") (not (include "ackgate.redisURLRef" .)) }}
{{- fail "redis: standalone mode needs redis.url or redis.existingSecret" }}
{{- end }}
{{- $_ := include "ackgate.sentinelPasswordRef" . }}
{{- $_ := include "ackgate.metricsTokenRef" . }}
{{- $_ := include "ackgate.validateRoutes" . }}
{{- if and $v.ingress.enabled (not $v.ingress.hosts) }}
{{- fail "ingress: list the host names brokers push to in ingress.hosts" }}
{{- end }}
{{- if and $v.httpRoute.enabled (not $v.httpRoute.parentRefs) }}
{{- fail "httpRoute: name the Gateway to attach to in httpRoute.parentRefs" }}
{{- end }}
{{- $_ := include "ackgate.keyHashSecretRef" . }}
{{- $_ := include "ackgate.adminTokensRef" . }}
{{- $_ := include "ackgate.outboxKeyRef" . }}
{{- $_ := include "ackgate.outboxOldKeysRef" . }}
{{- if and $v.metricsToken.value (eq $v.metricsToken.value $v.adminToken.value) }}
{{- fail "metricsToken: must differ from adminToken: it is meant for a scraper that may not read evidence" }}
{{- end }}
{{- if and (not $v.routes) (not $v.routesFile) }}
{{- fail "routes: set routes (a list of routes) or routesFile (a whole routes file); the gateway does not start without a route" }}
{{- end }}
{{- if and $v.routes $v.routesFile }}
{{- fail "routes: set routes or routesFile, not both" }}
{{- end }}
{{- if eq (int $v.ports.ingest) (int $v.ports.admin) }}
{{- fail "ports: ingest and admin must differ: the admin API never shares the ingest listener" }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail "autoscaling: minReplicas is larger than maxReplicas" }}
{{- end }}
{{- $managed := list "GATEWAY_DATABASE_URL" "GATEWAY_REDIS_URL" "GATEWAY_REDIS_ADDRS" "GATEWAY_REDIS_MASTER_NAME" "GATEWAY_REDIS_SENTINEL_PASSWORD" "GATEWAY_REDIS_CLUSTER" "GATEWAY_ROUTES_FILE" "GATEWAY_LISTEN_ADDR" "GATEWAY_ADMIN_ADDR" "GATEWAY_ADMIN_TOKEN" "GATEWAY_ADMIN_TOKENS" "GATEWAY_METRICS_TOKEN" "GATEWAY_MAX_BODY_BYTES" "GATEWAY_READ_HEADER_TIMEOUT" "GATEWAY_READ_TIMEOUT" "GATEWAY_WRITE_TIMEOUT" "GATEWAY_IDLE_TIMEOUT" "GATEWAY_SHUTDOWN_TIMEOUT" "GATEWAY_LOG_LEVEL" "GATEWAY_LOG_FORMAT" "GATEWAY_INSTANCE_ID" "GATEWAY_OIDC_JWKS_URL" "GATEWAY_SNS_CONFIRMATION_MAX_AGE" "GATEWAY_MAX_CLOCK_SKEW" "GATEWAY_KEY_HASH_SECRET" "GATEWAY_OUTBOX_KEY" "GATEWAY_OUTBOX_OLD_KEYS" "GATEWAY_CONSOLE_ENABLED" "GATEWAY_CONSOLE_SESSION_TTL" "GATEWAY_CONSOLE_ALLOW_HTTP" "GATEWAY_CONSOLE_TRACE_URL" "GATEWAY_MAX_IN_FLIGHT" "GATEWAY_MAX_BODY_BYTES_IN_FLIGHT" "GATEWAY_ADMISSION_WAIT" "GATEWAY_MEMORY_LIMIT" "GATEWAY_MEMORY_LIMIT_RATIO" "GATEWAY_FENCE_TTL" "GATEWAY_LANES_REFRESH" "GATEWAY_RECONCILE_POLL" "GATEWAY_PURGE_INTERVAL" "GATEWAY_PURGE_BATCH" "GATEWAY_RELAY_POLL" "GATEWAY_RELAY_CONCURRENCY" }}
{{- if $v.gateway.godebug }}
{{- $managed = append $managed "GODEBUG" }}
{{- end }}
{{- range $v.extraEnv }}
{{- if has .name $managed }}
{{- fail (printf "extraEnv: %s is set by the chart from its own values; use those instead" .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The routes file's text. */}}
{{- define "ackgate.routesFile" -}}
{{- if .Values.routesFile }}
{{- .Values.routesFile }}
{{- else }}
{{- toYaml (dict "routes" .Values.routes) }}
{{- end }}
{{- end }}

{{/*
Security contexts shared by the gateway and the migration pods. Not
configurable beyond the ids: the hardening is part of the chart.
*/}}
{{- define "ackgate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ int .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ int .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ int .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "ackgate.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Where the routes ConfigMap is mounted, and the file GATEWAY_ROUTES_FILE names. */}}
{{- define "ackgate.routesDir" -}}/etc/ackgate{{- end }}
{{- define "ackgate.routesPath" -}}{{ include "ackgate.routesDir" . }}/routes.yaml{{- end }}

{{/*
The routes file's vocabulary: the keys each section of a route may hold and
the values of its enumerated fields. charts/routes_test.go holds it to the
gateway's own (config.RouteFileVocabulary), so that it cannot drift.
*/}}
{{- define "ackgate.routeVocabulary" -}}
{{- toJson (dict
  "fields" (dict
    "" (list "ack_deadline" "auth" "basic_auth" "broker" "broker_retention" "dead_letter" "dedupe_window" "effect" "fingerprint" "handoff" "local" "max_attempts" "name" "oidc" "operation_key" "private" "pubsub_mode" "raw_delivery" "reconcile" "renewal" "retention" "shape" "sources" "tenant" "verification_token_env")
    "basic_auth" (list "password_env" "username_env")
    "effect" (list "body_mode" "evidence" "headers" "lookup_url" "method" "result_id_header" "result_id_pointer" "retryable_statuses" "terminal_statuses" "timeout" "url")
    "fingerprint" (list "attributes" "data" "pointers" "version")
    "handoff" (list "retry_max" "retry_min")
    "local" (list "params" "role" "sql" "timeout")
    "oidc" (list "audience" "jwks_url" "service_account")
    "operation_key" (list "kind" "name")
    "reconcile" (list "interval" "max_interval" "rate_per_second")
    "renewal" (list "interval" "max_extension"))
  "enums" (dict
    "auth" (list "basic" "none" "oidc" "sns_signature")
    "broker" (list "pubsub" "sns")
    "dead_letter" (list "broker" "gateway")
    "effect.body_mode" (list "cloudevent" "cloudevent_binary" "envelope" "raw")
    "effect.evidence" (list "result_id" "status_only")
    "operation_key.kind" (list "attribute" "json_pointer" "message_id")
    "pubsub_mode" (list "unwrapped" "wrapped")
    "shape" (list "handoff" "idempotent" "local" "lookup" "repeatable" "unsafe"))) }}
{{- end }}

{{/*
Validates the routes (routes, or routesFile parsed) when the chart is
rendered, so that `helm template`, `helm install` and `helm upgrade` refuse a
routes file the gateway would refuse at start: every route a mapping with a
unique, well-formed name; no key the gateway does not know, at any level;
broker, auth and shape present and among their values, and every other
enumerated field too; an effect with a url on every shape but local, a local
statement on local. What needs the gateway's own rules (durations against
each other, secrets, the shapes' finer constraints) stays with
`gateway check-config`, which a CI job can run on the same file.
*/}}
{{- define "ackgate.validateRoutes" -}}
{{- $voc := include "ackgate.routeVocabulary" . | fromJson }}
{{- $routes := .Values.routes }}
{{- if .Values.routesFile }}
{{- $file := fromYaml .Values.routesFile }}
{{- if hasKey $file "Error" }}
{{- fail (printf "routesFile: not a YAML document: %s" (index $file "Error")) }}
{{- end }}
{{- range $k, $_ := $file }}
{{- if ne $k "routes" }}
{{- fail (printf "routesFile: unknown top-level key %q; a routes file holds only routes:" $k) }}
{{- end }}
{{- end }}
{{- $routes = index $file "routes" | default list }}
{{- if not (kindIs "slice" $routes) }}
{{- fail "routesFile: routes must be a list of routes" }}
{{- end }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $r := $routes }}
{{- if not (kindIs "map" $r) }}
{{- fail (printf "routes[%d]: a route is a mapping of fields, got %v" $i $r) }}
{{- end }}
{{- $name := toString (index $r "name" | default "") }}
{{- if not (regexMatch "^[a-z0-9][a-z0-9_-]{0,62}$" $name) }}
{{- fail (printf "routes[%d]: name %q: required, lower-case letters, digits, - and _, at most 63 characters" $i $name) }}
{{- end }}
{{- $where := printf "route %q" $name }}
{{- if hasKey $seen $name }}
{{- fail (printf "%s: the name is used by another route" $where) }}
{{- end }}
{{- $_ := set $seen $name true }}
{{- range $k, $v := $r }}
{{- if not (has $k (index $voc.fields "")) }}
{{- fail (printf "%s: unknown field %q (the fields are %s)" $where $k (join ", " (index $voc.fields ""))) }}
{{- end }}
{{- if and (hasKey $voc.fields $k) (ne $k "") }}
{{- if not (kindIs "map" $v) }}
{{- fail (printf "%s: %s must be a mapping of fields" $where $k) }}
{{- end }}
{{- range $sk, $_ := $v }}
{{- if not (has $sk (index $voc.fields $k)) }}
{{- fail (printf "%s: unknown field %s.%s (the fields are %s)" $where $k $sk (join ", " (index $voc.fields $k))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $field := list "broker" "auth" "shape" }}
{{- if not (hasKey $r $field) }}
{{- fail (printf "%s: %s is required (%s)" $where $field (join ", " (index $voc.enums $field))) }}
{{- end }}
{{- end }}
{{- range $field, $allowed := $voc.enums }}
{{- $path := splitList "." $field }}
{{- $v := "" }}
{{- if eq (len $path) 1 }}
{{- $v = index $r $field | default "" }}
{{- else if kindIs "map" (index $r (first $path)) }}
{{- $v = index (index $r (first $path)) (last $path) | default "" }}
{{- end }}
{{- if and $v (not (has (toString $v) $allowed)) }}
{{- fail (printf "%s: %s %q is not one of %s" $where $field (toString $v) (join ", " $allowed)) }}
{{- end }}
{{- end }}
{{- if eq (toString $r.shape) "local" }}
{{- if not (and (kindIs "map" (index $r "local")) (index (index $r "local") "sql")) }}
{{- fail (printf "%s: shape local needs local.sql, the statement that is its effect" $where) }}
{{- end }}
{{- else if not (and (kindIs "map" (index $r "effect")) (index (index $r "effect") "url")) }}
{{- fail (printf "%s: shape %s needs effect.url, the downstream call that is its effect" $where (toString $r.shape)) }}
{{- end }}
{{- end }}
{{- end }}
