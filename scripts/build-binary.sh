#!/usr/bin/env bash
# Builds the one-file `ezra` executable: build/dist/ezra-<os>_<arch>.
#
# PyInstaller runs from a virtualenv of its own (build/venv) holding only
# EZRA's dependencies and PyInstaller, so whatever else is installed on the
# machine stays out of the binary. The first run creates it (about a minute
# with the build); later runs reuse it.
#
#   scripts/build-binary.sh               # -> build/dist/ezra-linux_x86_64 (here)
#   DIST_DIR=/tmp/out scripts/build-binary.sh
#
# Environment: PYTHON (default python3, needs a shared libpython: python.org,
# Debian, pyenv and actions/setup-python builds have one), VENV_DIR
# (build/venv), DIST_DIR (build/dist), WORK_DIR (build/work).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV_DIR=${VENV_DIR:-build/venv}
DIST_DIR=${DIST_DIR:-build/dist}
WORK_DIR=${WORK_DIR:-build/work}
PIP=(-m pip install -q --disable-pip-version-check)

if [ "$(uname -s)" = Linux ] && ! { command -v objcopy && command -v strip; } >/dev/null; then
  echo "build-binary.sh: PyInstaller needs binutils (objcopy, strip): apt-get install binutils" >&2
  exit 1
fi

# (Re)create the venv when it is missing or was made by another Python.
version='import sys; print(sys.version)'
if [ ! -x "$VENV_DIR/bin/python" ] || [ "$("$VENV_DIR/bin/python" -c "$version")" != "$("$PYTHON" -c "$version")" ]; then
  rm -rf "$VENV_DIR"
  "$PYTHON" -m venv "$VENV_DIR"
fi
# The dependencies as setup.cfg declares them (plus PyInstaller, the `build`
# extra), not EZRA itself: PyInstaller takes EZRA from this source tree.
"$VENV_DIR/bin/python" - > "$VENV_DIR/requirements.txt" <<'EOF'
import configparser
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
for section, key in (("options", "install_requires"), ("options.extras_require", "build")):
    print("\n".join(line for line in cfg[section][key].splitlines() if line.strip()))
EOF
"$VENV_DIR/bin/python" "${PIP[@]}" -r "$VENV_DIR/requirements.txt"

# PyInstaller's own gevent hook lists gevent's test suite and libuv loop,
# which ezra.spec excludes on purpose: drop those ~150 "not found" warnings.
"$VENV_DIR/bin/python" -m PyInstaller --noconfirm --log-level WARN \
  --distpath "$DIST_DIR" --workpath "$WORK_DIR" ezra.spec 2>&1 \
  | sed -E '/Hidden import "gevent\.(tests|testing|libuv)/d' >&2

# The name ezra.spec gives it (release names: linux_x86_64, linux_arm64, macos_arm64).
case "$(uname -s)" in Darwin) os=macos ;; *) os=$(uname -s | tr '[:upper:]' '[:lower:]') ;; esac
case "$(uname -m)" in aarch64|arm64) arch=arm64 ;; amd64) arch=x86_64 ;; *) arch=$(uname -m) ;; esac
binary="$DIST_DIR/ezra-${os}_${arch}"
echo "built $binary ($(du -h "$binary" | cut -f1)): $("$binary" --version)"
