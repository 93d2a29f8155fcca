#!/usr/bin/env bash
# Installs the pinned Helm with `go install` (the Go module proxy is the only source needed; Debian
# ships no helm package), unless a helm of exactly that version is already on PATH, in the Go bin
# directory, or in this script's cache. Prints the path of the helm binary on its last line, so
# callers can do:
#   HELM="$(charts/validate/install-helm.sh | tail -n1)"
#
# The build takes minutes (Helm pulls in much of Kubernetes), so it is done once per version, into
# a cache directory keyed on that version: ${HELM_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/idemproxy/helm}/<version>/helm.
# A helm already in your Go bin directory is never replaced. After `go clean -cache` the cached
# binary is still there; deleting it costs one rebuild.
#
# `go install` does not run Helm's Makefile, so the ldflags it sets are given here: the version
# (`helm version` would otherwise print "v3.22") and the default Kubernetes version that
# `helm template`/`helm lint` assume (otherwise v1.20, which fails the chart's kubeVersion).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"

gobin="$(go env GOBIN)"
if [[ -z "$gobin" ]]; then
  gobin="$(go env GOPATH)/bin"
fi
cache="${HELM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idemproxy/helm}/$HELM_VERSION"

installed_version() {
  "$1" version --template '{{.Version}}' 2>/dev/null || true
}

for candidate in "${HELM:-}" "$cache/helm" "$(command -v helm 2>/dev/null || true)" "$gobin/helm"; do
  if [[ -n "$candidate" && -x "$candidate" && "$(installed_version "$candidate")" == "$HELM_VERSION" ]]; then
    echo "helm $HELM_VERSION already installed" >&2
    echo "$candidate"
    exit 0
  fi
done

echo "installing helm $HELM_VERSION with go install into $cache (once per version; a few minutes on a cold Go build cache)" >&2
# The Kubernetes version Helm assumes offline is derived from its client-go, as its Makefile does.
gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")" # e.g. v0.37.0
k8s_minor="$(echo "$client_go" | cut -d. -f2)"
if [[ -z "$k8s_minor" ]]; then
  echo "install-helm.sh: cannot read the k8s.io/client-go version from $gomod" >&2
  exit 1
fi

ldflags="-s -w"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.metadata="
ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"
ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"

mkdir -p "$cache"
GOBIN="$cache" CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

got="$(installed_version "$cache/helm")"
if [[ "$got" != "$HELM_VERSION" ]]; then
  echo "install-helm.sh: installed $cache/helm reports version '$got', want $HELM_VERSION" >&2
  exit 1
fi
echo "$cache/helm"
