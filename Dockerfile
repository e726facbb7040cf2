# syntax=docker/dockerfile:1

# ackgate gateway image: a static Go binary on distroless, running as a
# non-root user. Build from the repository root:
#
#   docker build -t REGISTRY/ackgate:TAG .
#
# charts/chart_test.go checks this file's essentials (stages, static build
# flags, non-root user, ports, entrypoint) on every `go test ./...`.

# The builder runs on the build host's platform and cross-compiles for the
# target, which a pure-Go (CGO_ENABLED=0) build can do without emulation.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src

# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .
# CGO_ENABLED=0: a static binary with no libc to load, which is what lets it
# run on distroless/static. -trimpath keeps build paths out of the binary and
# -s -w drop the symbol and debug tables.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/gateway ./cmd/gateway

# distroless/static: CA certificates, tzdata and /etc/passwd, no shell, no
# package manager. The :nonroot variant's user is uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gateway /gateway
# Numeric, so that Kubernetes can verify runAsNonRoot without reading the
# image's /etc/passwd (it refuses a non-numeric user under runAsNonRoot
# unless runAsUser is also set). 65532 is distroless's "nonroot".
USER 65532:65532
# Ingest (push deliveries, /healthz, /readyz) and admin (bearer token).
EXPOSE 8080 8081
ENTRYPOINT ["/gateway"]
CMD ["serve"]
