"""The package as it would be published (issue 48): `python -m build` makes an sdist and a
wheel that pass `twine check`, and the wheel installs into a clean virtual environment with
the frameworks' extras, where `ezra` starts, answers `ezra ping` and stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile

import pytest

from support_servers import ROOT, free_port, wait_until

pytestmark = pytest.mark.slow
CLEAN = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # nothing but the venv's


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    pytest.importorskip("build", reason="pip install build (part of the test extra)")
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def test_sdist_and_wheel_pass_twine_check(dist):
    pytest.importorskip("twine", reason="pip install twine (part of the test extra)")
    files = sorted(dist.iterdir())
    assert sorted(path.suffix for path in files) == [".gz", ".whl"], files
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    names = zipfile.ZipFile(next(dist.glob("*.whl"))).namelist()
    for part in ("ezra/storage/schema.sql", "ezra/web/static/dashboard.css"):
        assert part in names
    assert any(name.endswith("licenses/LICENSE") for name in names), "the wheel carries the licence"


def test_the_wheel_installs_with_its_extras_in_a_clean_venv_and_serves(dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = next(dist.glob("*.whl"))
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                              f"{wheel}[celery,dramatiq,taskiq]"], capture_output=True, text=True, timeout=900, env=CLEAN)
    assert install.returncode == 0, install.stderr[-3000:]
    imports = subprocess.run([str(venv / "bin" / "python"), "-c", "import ezra, ezra.celery, ezra.dramatiq, ezra.taskiq; print(ezra.__file__)"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path, env=CLEAN)
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.startswith(str(venv)), f"ezra imported from {imports.stdout}, not from the wheel"
    port = free_port()
    server = subprocess.Popen([str(venv / "bin" / "ezra"), "--port", str(port), "--data-dir", str(tmp_path / "data")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=CLEAN)
    try:
        def pings() -> bool:
            return subprocess.run([str(venv / "bin" / "ezra"), "ping", "--port", str(port)], capture_output=True,
                                  timeout=30, cwd=tmp_path, env=CLEAN).returncode == 0
        wait_until(pings, timeout=60)
    finally:
        server.send_signal(signal.SIGTERM)
        _, log = server.communicate(timeout=60)
    assert server.returncode == 0, log
    assert "listening on" in log, log
