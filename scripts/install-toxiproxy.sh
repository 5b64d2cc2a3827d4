#!/usr/bin/env bash
# Build Toxiproxy's server (Shopify's TCP proxy that adds latency, bandwidth limits and cuts;
# the emulated WAN of docs/wan.md) from source with the Go toolchain and the Go module proxy,
# into a cache outside the clone: ${ASTRAFLOW_CACHE:-~/.cache/astraflow}/bin/toxiproxy-server.
#
# Idempotent: a second call finds the pinned version there and returns at once. Where Go is
# missing it says so and exits 0 without a binary (the tests that need Toxiproxy then skip);
# a build that fails exits 1. Takes about a minute the first time (35 s on 2 cores).
# GO=/path/to/go picks the toolchain; TOXIPROXY_VERSION=vX.Y.Z overrides the pin.
set -euo pipefail
VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
BIN_DIR="${ASTRAFLOW_CACHE:-$HOME/.cache/astraflow}/bin"
TARGET="$BIN_DIR/toxiproxy-server"

if [ -x "$TARGET" ] && "$TARGET" -version 2>/dev/null | grep -qx "toxiproxy-server version ${VERSION#v}"; then
  echo "toxiproxy-server ${VERSION#v} is installed: $TARGET"
  exit 0
fi

GO_BIN="${GO:-$(command -v go || true)}"
if [ -z "$GO_BIN" ] && [ -x /usr/local/go/bin/go ]; then
  GO_BIN=/usr/local/go/bin/go
fi
if [ -z "$GO_BIN" ]; then
  echo "toxiproxy-server not installed: the Go toolchain was not found (install Go from" \
       "https://go.dev/dl/ or set GO=/path/to/go, then run $0 again); the emulated-WAN" \
       "tests skip without it" >&2
  exit 0
fi

echo "==> building toxiproxy-server $VERSION with $("$GO_BIN" version) (about a minute, once)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# CGO off: a static binary that needs no C compiler. The -X flag sets the version that
# `toxiproxy-server -version` and GET /version report (a plain `go install` says "git").
if ! CGO_ENABLED=0 GOBIN="$WORK" GOFLAGS=-buildvcs=false "$GO_BIN" install -trimpath \
     -ldflags "-s -w -X github.com/Shopify/toxiproxy/v2.Version=${VERSION#v}" \
     "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION"; then
  echo "error: building toxiproxy-server $VERSION failed (output above); it needs the Go" \
       "module proxy (GOPROXY=$("$GO_BIN" env GOPROXY)) and Go >= 1.23" >&2
  exit 1
fi
mkdir -p "$BIN_DIR"
mv -f "$WORK/server" "$TARGET.tmp"
mv -f "$TARGET.tmp" "$TARGET"  # atomic: a concurrent caller never runs half a binary
echo "toxiproxy-server ${VERSION#v} installed: $TARGET"
