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
{{- $managed := list "GATEWAY_DATABASE_URL" "GATEWAY_REDIS_URL" "GATEWAY_REDIS_ADDRS" "GATEWAY_REDIS_MASTER_NAME" "GATEWAY_REDIS_SENTINEL_PASSWORD" "GATEWAY_REDIS_CLUSTER" "GATEWAY_ROUTES_FILE" "GATEWAY_LISTEN_ADDR" "GATEWAY_ADMIN_ADDR" "GATEWAY_ADMIN_TOKEN" "GATEWAY_ADMIN_TOKENS" "GATEWAY_METRICS_TOKEN" "GATEWAY_MAX_BODY_BYTES" "GATEWAY_READ_HEADER_TIMEOUT" "GATEWAY_READ_TIMEOUT" "GATEWAY_WRITE_TIMEOUT" "GATEWAY_IDLE_TIMEOUT" "GATEWAY_SHUTDOWN_TIMEOUT" "GATEWAY_LOG_LEVEL" "GATEWAY_INSTANCE_ID" "GATEWAY_OIDC_JWKS_URL" "GATEWAY_SNS_CONFIRMATION_MAX_AGE" "GATEWAY_MAX_CLOCK_SKEW" "GATEWAY_KEY_HASH_SECRET" "GATEWAY_OUTBOX_KEY" "GATEWAY_OUTBOX_OLD_KEYS" "GATEWAY_CONSOLE_ENABLED" "GATEWAY_CONSOLE_SESSION_TTL" "GATEWAY_CONSOLE_ALLOW_HTTP" "GATEWAY_CONSOLE_TRACE_URL" "GATEWAY_MAX_IN_FLIGHT" "GATEWAY_ADMISSION_WAIT" "GATEWAY_MEMORY_LIMIT" "GATEWAY_MEMORY_LIMIT_RATIO" "GATEWAY_FENCE_TTL" "GATEWAY_LANES_REFRESH" "GATEWAY_RECONCILE_POLL" "GATEWAY_PURGE_INTERVAL" "GATEWAY_PURGE_BATCH" "GATEWAY_RELAY_POLL" "GATEWAY_RELAY_CONCURRENCY" }}
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
