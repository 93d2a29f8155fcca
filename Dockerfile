# idemproxy container image: two stages, static binary on distroless.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t idemproxy .
#
# The build stage runs `make build-static`, the same target CI runs, so the command that
# produces the image's binary is tested on every change.

# Keep the minor version in step with the go line of go.mod.
FROM golang:1.26-bookworm AS build

# Set by BuildKit/buildx for multi-platform builds; empty with the classic builder, in which
# case Go builds for the build machine.
ARG TARGETOS
ARG TARGETARCH

WORKDIR /src

# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .

ARG VERSION=dev
RUN GOOS=${TARGETOS} GOARCH=${TARGETARCH} make build-static VERSION=${VERSION}

FROM gcr.io/distroless/static-debian12:nonroot

ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="idemproxy" \
      org.opencontainers.image.description="Reverse proxy enforcing Idempotency-Key semantics in front of HTTP APIs, backed by Redis" \
      org.opencontainers.image.url="https://github.com/idemproxy/idemproxy" \
      org.opencontainers.image.source="https://github.com/idemproxy/idemproxy" \
      org.opencontainers.image.documentation="https://github.com/idemproxy/idemproxy#readme" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"

COPY --from=build /src/bin/idemproxy /idemproxy

USER 65532:65532
# LISTEN_ADDR (proxy) and ADMIN_ADDR (/metrics, /healthz, /readyz).
EXPOSE 8080 9090

ENTRYPOINT ["/idemproxy"]
