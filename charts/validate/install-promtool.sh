#!/usr/bin/env bash
# Installs promtool, which the chart tests use to check the rendered PrometheusRule
# (`promtool check rules`) and to unit-test its alerts (`promtool test rules`). Prints the path of
# the promtool binary on its last line, so callers can do:
#   PROMTOOL="$(charts/validate/install-promtool.sh | tail -n1)"
#
# `go install github.com/prometheus/prometheus/cmd/promtool` is refused (Prometheus's go.mod has
# exclude directives), so promtool comes from Debian's `prometheus` package. Only the package file
# is fetched (`apt-get download`) and promtool is extracted from it into a cache directory:
# installing the package would pull in the web UI's JavaScript and start a Prometheus service.
# Cache: ${PROMTOOL_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/idemproxy/promtool}/<package version>/promtool.
#
# A promtool in $PROMTOOL, on PATH or in the cache is used as it is. Without apt-get the script
# fails, naming what to install; the tests then skip, except in CI (CI=true), where they fail.
set -euo pipefail

works() {
  [[ -n "$1" && -x "$1" ]] && "$1" --version >/dev/null 2>&1
}

cache_root="${PROMTOOL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idemproxy/promtool}"
for candidate in "${PROMTOOL:-}" "$(command -v promtool 2>/dev/null || true)" "$cache_root"/*/promtool; do
  if works "$candidate"; then
    echo "promtool already installed: $("$candidate" --version 2>&1 | head -n1)" >&2
    echo "$candidate"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  echo "install-promtool.sh: no apt-get/dpkg-deb here; install promtool 2.x (it ships with Prometheus:" \
    "https://prometheus.io/download/) and put it on PATH or in \$PROMTOOL" >&2
  exit 1
fi

sudo=""
if [[ "$(id -u)" -ne 0 ]] && command -v sudo >/dev/null 2>&1; then
  sudo="sudo"
fi

version="$(apt-cache policy prometheus 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')"
if [[ -z "$version" || "$version" == "(none)" ]]; then
  echo "install-promtool.sh: no prometheus package known to apt; running apt-get update" >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
  version="$(apt-cache policy prometheus 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')"
fi
if [[ -z "$version" || "$version" == "(none)" ]]; then
  echo "install-promtool.sh: apt offers no prometheus package; install promtool by hand" >&2
  exit 1
fi

dest="$cache_root/${version//[:+~]/_}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "install-promtool.sh: extracting promtool from Debian's prometheus $version into $dest" >&2
# As root, apt-get warns that the _apt user cannot write to $tmp and downloads unsandboxed: harmless.
(cd "$tmp" && apt-get download -qq "prometheus=$version" >/dev/null)
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
mkdir -p "$dest"
install -m 0755 "$tmp/root/usr/bin/promtool" "$dest/promtool"

if ! works "$dest/promtool"; then
  echo "install-promtool.sh: $dest/promtool does not run" >&2
  exit 1
fi
"$dest/promtool" --version 2>&1 | head -n1 >&2
echo "$dest/promtool"
