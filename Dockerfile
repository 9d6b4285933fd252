# One Dockerfile for every service; the build arg SERVICE picks what the
# image runs:
#   ./services/payments, ./services/rewards, ./services/notifications,
#   ./services/notifications/cmd/smsprovider   a package of this module
#   github.com/stripe/stripe-mock@v0.203.0      a module@version to go install
# e.g. docker build --build-arg SERVICE=./services/payments -t payments .
# The image holds that one static binary as /usr/local/bin/app (its
# entrypoint) and /usr/local/bin/healthcheck for the container healthcheck,
# on distroless static, as the nonroot user.
FROM golang:1.26 AS build
ARG SERVICE=./services/payments
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN set -e; \
    case "$SERVICE" in \
      *@*) GOBIN=/tmp/gobin go install -trimpath -ldflags='-s -w' "$SERVICE"; mkdir -p /out; mv /tmp/gobin/* /out/app ;; \
      ./*) go build -trimpath -ldflags='-s -w' -o /out/app "$SERVICE" ;; \
      *) echo "SERVICE=$SERVICE: want ./path/to/package or module@version" >&2; exit 1 ;; \
    esac; \
    go build -trimpath -ldflags='-s -w' -o /out/healthcheck ./cmd/healthcheck

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/app"]
