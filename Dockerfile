# syntax=docker/dockerfile:1

# ackgate gateway image: a static Go binary on distroless, running as a
# non-root user. Build from the repository root, naming the version (what
# `gateway version` prints and every span's service.version; the chart's
# appVersion for a release) and the commit:
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#       -t REGISTRY/ackgate:0.1.0 .
#
# Pin by digest: the defaults below name the base images by tag only, so
# that a reader and an update bot can follow them, and a build from them is
# not reproducible. A release build resolves each tag to the digest it
# points to at that moment (docker buildx imagetools inspect golang:1.26,
# likewise gcr.io/distroless/static-debian12:nonroot) and passes both:
#
#   --build-arg GO_IMAGE=golang:1.26@sha256:<digest> \
#   --build-arg RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:<digest>
#
# The image's org.opencontainers.image.base.name label records the
# RUNTIME_IMAGE it was given, digest included.
#
# charts/chart_test.go checks this file's essentials (stages, static build
# flags, non-root user, ports, entrypoint) on every `go test ./...`.

# The builder runs on the build host's platform and cross-compiles for the
# target, which a pure-Go (CGO_ENABLED=0) build can do without emulation.
ARG GO_IMAGE=golang:1.26
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src

# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .
# CGO_ENABLED=0: a static binary with no libc to load, which is what lets it
# run on distroless/static. -trimpath keeps build paths out of the binary,
# -s -w drop the symbol and debug tables, and -X stamps the version (the
# build context has no .git to read it from).
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X github.com/ackgate/ackgate/telemetry.version=${VERSION}" -o /out/gateway ./cmd/gateway

# distroless/static: CA certificates, tzdata and /etc/passwd, no shell, no
# package manager. The :nonroot variant's user is uid 65532.
FROM ${RUNTIME_IMAGE}
ARG RUNTIME_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
# OCI image annotations, read by registries and scanners.
LABEL org.opencontainers.image.title="ackgate" \
      org.opencontainers.image.description="Push gateway for Pub/Sub and SNS that acks only after durable evidence of the effect" \
      org.opencontainers.image.source="https://github.com/ackgate/ackgate" \
      org.opencontainers.image.url="https://github.com/ackgate/ackgate" \
      org.opencontainers.image.documentation="https://github.com/ackgate/ackgate/blob/main/docs/deploy.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
COPY --from=build /out/gateway /gateway
# The chart's default (gateway.godebug): without it the runtime starts each
# new goroutine's stack at the average size of those it scanned, which the
# deep delivery goroutines raise for everyone (6 to 10 MB more at 1,000
# deliveries in flight, docs/performance.md). Go takes this one only from
# the environment, not as a //go:debug line. A deployment's own GODEBUG
# replaces it.
ENV GODEBUG=adaptivestackstart=0
# Numeric, so that Kubernetes can verify runAsNonRoot without reading the
# image's /etc/passwd (it refuses a non-numeric user under runAsNonRoot
# unless runAsUser is also set). 65532 is distroless's "nonroot".
USER 65532:65532
# Ingest (push deliveries, /healthz, /readyz) and admin (bearer token).
EXPOSE 8080 8081
ENTRYPOINT ["/gateway"]
CMD ["serve"]
