#!/usr/bin/env bash
# Installs what the test suite needs on Debian/Ubuntu when it is missing:
# redis-server and redis-cli (package redis-server; redis-tools brings redis-cli).
# The tests never skip for want of Redis: they fail and point here.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

sudo=""
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "install-deps: need ${missing[*]}; run as root or install them: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: no apt-get here; install ${missing[*]} (Redis 6.2 or newer) by hand" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts a system redis-server on :6379 after installing it; the tests
# start their own on free ports and do not need it, so leave it as it is.
redis-server --version
