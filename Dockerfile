# Builds budgetctl: the operator CLI and the demo's worker and provider,
# which docker-compose.yml runs as services.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/budgetctl ./cmd/budgetctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/budgetctl /usr/local/bin/budgetctl
ENTRYPOINT ["/usr/local/bin/budgetctl"]
