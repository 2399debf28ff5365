# delaybridge container image.
#
#   docker build -t delaybridge \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --rm -e DELAYBRIDGE_AMQP_URL=amqp://guest:guest@rabbit:5672/ \
#     -p 8080:8080 -v delaybridge-data:/data delaybridge
#
# See docker-compose.yml for a broker + bridge setup.

# ---- build ---------------------------------------------------------------------
# Builds on the build host's platform and cross-compiles for the target one
# (docker buildx build --platform linux/arm64 ... works without emulation).
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src

# Dependencies first, in their own layer: it is rebuilt only when go.mod or
# go.sum change, not on every source edit.
COPY go.mod go.sum* ./
RUN go mod download && go mod verify

COPY . .
ARG TARGETOS TARGETARCH
# The version and revision that `delaybridge version` and the
# delaybridge_build_info metric report. The build context has no .git
# (.dockerignore), so go build cannot stamp them: pass them in, as
# docker-compose.yml does:
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#                --build-arg REVISION=$(git rev-parse HEAD) .
# Without them the image says "unknown" rather than guess.
ARG VERSION=""
ARG REVISION=""
RUN --mount=type=cache,target=/root/.cache/go-build \
    bi=github.com/delaybridge/delaybridge/internal/buildinfo \
 && CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X '$bi.version=${VERSION:-unknown}' -X '$bi.revision=${REVISION:-unknown}'" \
      -o /out/delaybridge . \
 && mkdir -p /out/data

# ---- runtime -------------------------------------------------------------------
# Why busybox and not distroless: the binary is static (CGO_ENABLED=0) so it
# needs no libc, but a container health check needs a program inside the image
# that can ask the bridge's own HTTP server for /readyz. distroless/static has
# no shell and no HTTP client; debian:bookworm-slim would need curl installed
# (~80 MB). busybox (~4 MB) has `wget`, which exits non-zero on a 503, so
# `wget -q -O /dev/null http://127.0.0.1:8080/readyz` is a working health check.
# The CA bundle is copied from the build stage for amqps:// connections.
FROM busybox:1.36

COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/delaybridge /usr/local/bin/delaybridge
# /data belongs to the unprivileged user so that a new named volume mounted
# there (which Docker seeds from the image, ownership included) is writable.
COPY --from=build --chown=65534:65534 /out/data /data

ENV DELAYBRIDGE_HTTP_ADDR=:8080 \
    DELAYBRIDGE_STORE_PATH=/data/delaybridge.db

# nobody:nogroup — never run as root.
USER 65534:65534
VOLUME /data
EXPOSE 8080

# 200 only while connected to the broker and the store (contract §6). Adjust
# or disable it if you change DELAYBRIDGE_HTTP_ADDR.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/readyz"]

ENTRYPOINT ["/usr/local/bin/delaybridge"]
