#!/usr/bin/env bash
# Installs what the tests need, then runs the whole suite. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use: redis-server (the vector harness and parity
# checks compare with the real Redis), binutils (strip/objcopy for the binary).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v objcopy >/dev/null 2>&1 || missing+=(binutils)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "note: ${missing[*]} not installed; the tests that need them will be skipped" >&2
  fi
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
exec python3 -m pytest "$@"
