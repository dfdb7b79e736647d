# The kvctl image the Kubernetes DaemonSet (deploy/kubernetes/kvctl.yaml) runs: `make image`
# builds it as ghcr.io/kvctl/kvctl:VERSION and :latest.
#
# kvctl links libc (cgo: NVML and the CUDA driver are opened at run time, from the host through
# the NVIDIA container runtime), so the runtime image is distroless base, not static. It runs
# as the distroless nonroot user, 65532:65532, the uid the DaemonSet's securityContext names.
# deploy/image_test.go checks this file: the user, the entrypoint, and that the binary built
# with the builder's command runs as that user.

ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/kvctl ./cmd/kvctl

FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/kvctl /usr/local/bin/kvctl
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvctl"]
CMD ["serve"]
