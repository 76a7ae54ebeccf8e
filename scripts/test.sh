#!/usr/bin/env bash
# Installs what the tests need, then runs the whole suite. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use: redis-server (the vector harness and parity
# checks compare with the real Redis), binutils (strip/objcopy for the binary),
# redis-tools (redis-cli), nodejs/npm, ruby-redis, golang-go and redigo (the client
# matrix, tests/test_clients.py).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v objcopy >/dev/null 2>&1 || missing+=(binutils)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
ruby -e 'require "redis"' >/dev/null 2>&1 || missing+=(ruby-redis)  # redis-rb, the Ruby client
command -v go >/dev/null 2>&1 || missing+=(golang-go)  # redigo, the Go client (GOPATH mode, no proxy)
[ -d /usr/share/gocode/src/github.com/gomodule/redigo ] || missing+=(golang-github-gomodule-redigo-dev)
command -v strace >/dev/null 2>&1 || missing+=(strace)  # tests/test_faults.py: the power-loss model
command -v openssl >/dev/null 2>&1 || missing+=(openssl)  # tests/test_abuse.py: a test certificate for TLS
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # tests/test_dashboard.py: a real browser
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)  # tests/test_first_hour.py: docs/alerts.yml
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)  # tests/test_first_hour.py: the units
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "note: ${missing[*]} not installed; the tests that need them will be skipped" >&2
  fi
fi

# The Node.js clients of the matrix, pinned by tests/node/package-lock.json, in build/node.
# (The Python clients that need an interpreter of their own, redis-py 5 and the worker
# libraries, are installed by the tests themselves into build/venv-* on first use.)
if command -v npm >/dev/null 2>&1 && { [ ! -d build/node/node_modules ] \
    || ! cmp -s tests/node/package-lock.json build/node/package-lock.json; }; then
  mkdir -p build/node && cp tests/node/package.json tests/node/package-lock.json build/node/
  (cd build/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
    || echo "note: npm ci failed; the Node.js client tests will be skipped" >&2
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test,docs]'
# The docs site (mkdocs.yml): a broken link or a page left out of it fails the run.
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet
# Everything, one test at a time: the slow families measure latencies and merge the
# compatibility tables. The core alone, in under a minute: scripts/test.sh -m "not slow" -n 4
exec python3 -m pytest "$@"
