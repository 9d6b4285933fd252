# One image with every binary of the project; docker-compose.yml picks the
# command per service.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/ ./services/payments ./services/rewards ./services/notifications ./services/notifications/cmd/smsprovider ./cmd/... \
 && CGO_ENABLED=0 GOBIN=/out go install github.com/stripe/stripe-mock@v0.203.0

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/ /usr/local/bin/
USER nonroot
