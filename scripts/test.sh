#!/usr/bin/env bash
# Installs what the tests need, then runs the whole suite. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server: the vector harness checks itself against the real Redis.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "note: redis-server is not installed; tests that compare with Redis will be skipped" >&2
  fi
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
exec python3 -m pytest "$@"
