"""`make lab` works: JupyterLab from this environment serves the repository (notebooks, examples, figures, configs,
README) with the quickstart as its default page, lists the notebooks without their paired ``.py`` sources, and offers
the project's kernel; and the environment files agree (pyproject.toml, the Makefile and environment.yml install the
same pins and extras).

The server is started as the Makefile's `lab` target starts it (its LAB_FLAGS, with their config file), plus what a
test needs: 127.0.0.1 only, a free port, a token, no browser, and Jupyter's config/data/runtime folders (and
IPython's, and the user's jupytext configuration) in a temporary directory, so no user configuration or user-level
kernel takes part and nothing is written to the home folder. Every wait is bounded and the server is stopped when
the ``lab_server`` block ends (``tests/test_lab_roundtrip.py`` starts it the same way, on a copy of the notebooks).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
QUICKSTART = "notebooks/00_quickstart.ipynb"  # relative to the server's root, the repository
START_TIMEOUT_S = 120.0  # a loaded 2-core machine; a typical start takes a few seconds
REQUEST_TIMEOUT_S = 30.0  # a paired notebook is read from two files (jupytext), on a loaded machine
STOP_TIMEOUT_S = 15.0

needs_jupyterlab = pytest.mark.skipif(
    importlib.util.find_spec("jupyterlab") is None,
    reason=f"jupyterlab is not installed in this environment ({sys.executable}); `make lab` (or "
           "pip install -e '.[lab]') installs it")


def makefile_lab_flags() -> list[str]:
    """The Makefile's LAB_FLAGS (the flags `make lab` starts JupyterLab with), continuation lines joined."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^LAB_FLAGS\s*:?=(.*)$", text, re.MULTILINE)
    assert match, "the Makefile defines no LAB_FLAGS"
    return shlex.split(match.group(1))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        assert response.status == 200, f"{url}: HTTP {response.status}"
        return json.loads(response.read().decode())


def stop(proc: subprocess.Popen) -> None:
    """Terminate the server (SIGTERM: it shuts down), wait, kill it if it does not exit."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)


@dataclass
class LabServer:
    """A running JupyterLab: its URL, token, process and log file."""

    base: str
    token: str
    proc: subprocess.Popen
    log_path: Path

    def request(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        """``method`` on ``/api/...`` ``path`` with the token; the decoded JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: HTTP {e.code} {e.read().decode(errors='replace')[:2000]}") from e
        return json.loads(raw) if raw else None


@contextlib.contextmanager
def lab_server(root: Path, scratch: Path) -> Iterator[LabServer]:
    """JupyterLab started in ``root`` as `make lab` starts it in the repository (see the module docstring); Jupyter's
    own folders under ``scratch``. Stopped when the block ends; ``RuntimeError`` when it does not start (also used by
    ``docs/lab_screenshots.py``)."""
    port, token = free_port(), os.urandom(16).hex()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(scratch / "config"), "JUPYTER_DATA_DIR": str(scratch / "data"),
           "JUPYTER_RUNTIME_DIR": str(scratch / "runtime"), "JUPYTER_PREFER_ENV_PATH": "1",
           "JUPYTER_PLATFORM_DIRS": "0", "IPYTHONDIR": str(scratch / "ipython"),
           "XDG_CONFIG_HOME": str(scratch / "xdg")}
    cmd = [sys.executable, "-m", "jupyterlab", *makefile_lab_flags(), "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           "--ServerApp.open_browser=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # as `make lab` does for root (containers)
    scratch.mkdir(parents=True, exist_ok=True)
    log_path = scratch / "jupyterlab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LabServer(f"http://127.0.0.1:{port}", token, proc, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(f"jupyterlab exited with {server.proc.returncode} before answering:\n"
                                   f"{server.log_path.read_text()}")
            try:
                get_json(f"{server.base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyterlab did not answer on {server.base} within {START_TIMEOUT_S:.0f} s:\n"
                                       f"{server.log_path.read_text()}")
                time.sleep(0.5)
        log_text = server.log_path.read_text()
        if "Exception while loading config file" in log_text:  # the server starts anyway, without it
            raise RuntimeError(f"the server's config file failed:\n{log_text}")
        yield server
    finally:
        stop(server.proc)
        if server.proc.returncode not in (0, -signal.SIGTERM):  # a clean shutdown on SIGTERM exits 0
            print(server.log_path.read_text())


def test_makefile_lab_serves_the_repository_with_the_quickstart_open():
    flags = makefile_lab_flags()
    assert "--ServerApp.root_dir=." in flags
    assert f"--LabApp.default_url=/lab/tree/{QUICKSTART}" in flags
    assert (REPO / QUICKSTART).is_file()
    config = next(f.split("=", 1)[1] for f in flags if f.startswith("--config="))
    assert (REPO / config).is_file() and (REPO / "jupytext.toml").is_file()


@needs_jupyterlab
def test_jupyterlab_serves_the_repository_and_project_kernel(tmp_path):
    with lab_server(REPO, tmp_path) as lab:
        # the root is the repository: the README, examples/my_plugin.py, figures/ and configs/ are in reach
        root = {item["name"]: item["type"] for item in lab.request("GET", "/api/contents?content=1")["content"]}
        assert {"README.md", "examples", "figures", "configs", "notebooks"} <= set(root), sorted(root)
        # ... opened as JupyterLab's editor opens them (a file, as text); the README never as a jupytext notebook
        assert lab.request("GET", "/api/contents/examples/my_plugin.py?type=file&format=text")["content"]
        assert root["README.md"] == "file"
        # notebooks/ lists every notebook once: its paired .py source is hidden (still read and written by jupytext)
        listed = {item["name"] for item in lab.request("GET", "/api/contents/notebooks?content=1")["content"]}
        committed = {p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
        assert committed <= listed and not {n for n in listed if n.endswith(".py")}, sorted(listed)

        # the quickstart is served as a notebook, paired with its source
        model = lab.request("GET", f"/api/contents/{QUICKSTART}?content=1")
        assert model["type"] == "notebook" and model["path"] == QUICKSTART
        cells = model["content"]["cells"]
        assert cells and any(c["cell_type"] == "code" for c in cells)
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells)
        assert model["content"]["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"
        kernel_name = model["content"]["metadata"]["kernelspec"]["name"]

        # the notebooks' kernel is the project's: a kernelspec of that name that starts this environment's python
        specs = lab.request("GET", "/api/kernelspecs")
        offered = sorted(specs["kernelspecs"])
        assert kernel_name in offered, f"kernel {kernel_name!r} not offered: {offered}"
        argv = specs["kernelspecs"][kernel_name]["spec"]["argv"]
        prefix = subprocess.run([argv[0], "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                                timeout=REQUEST_TIMEOUT_S, cwd=NOTEBOOKS).stdout.strip()
        assert prefix and os.path.samefile(prefix, sys.prefix), (
            f"kernel {kernel_name!r} starts {argv[0]} (prefix {prefix!r}), not this environment's python "
            f"({sys.prefix})")
        assert specs["default"] == kernel_name

        # the token is required
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{lab.base}/api/contents/{QUICKSTART}", timeout=REQUEST_TIMEOUT_S)
        assert denied.value.code == 403


# --- the environment: pyproject.toml, the Makefile and environment.yml name the same pins, extras and --no-deps ---

def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def make_variable(name: str) -> str:
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{name}\s*:?=(.*)$", text, re.MULTILINE)
    assert match, f"the Makefile defines no {name}"
    return match.group(1).strip()


def pinned(requirements, project: dict) -> dict:
    """{name: version} of the ``==`` pins among ``requirements``, following the project's own extras
    (``ftta[flower]``) recursively."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    own = canonicalize_name(project["project"]["name"])
    extras = project["project"].get("optional-dependencies", {})
    out: dict = {}
    for text in requirements:
        req = Requirement(text)
        if canonicalize_name(req.name) == own:
            for extra in req.extras:
                assert extra in extras, f"{text}: no extra {extra!r} in pyproject.toml"
                out.update(pinned(extras[extra], project))
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if pins:
            out[canonicalize_name(req.name)] = pins[0]
    return out


def test_environment_yml_installs_what_the_makefile_installs():
    pytest.importorskip("packaging")
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    project = pyproject()
    extras = project["project"]["optional-dependencies"]
    env_text = (REPO / "environment.yml").read_text()
    env = yaml.safe_load(env_text)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)

    # the same extras: environment.yml's editable install and the Makefile's EXTRAS, all defined in pyproject.toml
    editable = [p for p in pip if str(p).startswith("-e")]
    assert len(editable) == 1, f"environment.yml: one `-e .[extras]` line expected, got {editable}"
    env_extras = re.fullmatch(r"""-e\s+["']?\.\[([\w,\s-]+)\]["']?""", editable[0].strip())
    assert env_extras, f"environment.yml: cannot read the extras of {editable[0]!r}"
    env_extras = {e.strip() for e in env_extras.group(1).split(",")}
    make_extras = {e.strip() for e in make_variable("EXTRAS").split(",")}
    assert env_extras == make_extras, f"extras: environment.yml {sorted(env_extras)}, Makefile {sorted(make_extras)}"
    assert make_extras <= set(extras), f"extras not in pyproject.toml: {sorted(make_extras - set(extras))}"
    assert {"lab", "flower"} <= set(extras)
    assert 'pip install --quiet -e ".[$(EXTRAS)]"' in (REPO / "Makefile").read_text()

    # the same pins: every == pin of the installed requirements is listed in environment.yml with that version
    want = pinned([*project["project"]["dependencies"], *(r for e in make_extras for r in extras[e])], project)
    listed = {}
    for line in pip:
        if str(line).startswith("-"):
            continue
        req = Requirement(str(line))
        assert [s.operator for s in req.specifier] == ["=="], f"environment.yml: {line!r} is not a == pin"
        listed[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    assert listed == want, f"pins: environment.yml {listed}, pyproject.toml (extras {sorted(make_extras)}) {want}"

    # the same --no-deps packages: pyproject's [tool.ftta] no-deps, the Makefile's NO_DEPS, environment.yml's step
    no_deps = project["tool"]["ftta"]["no-deps"]
    assert make_variable("NO_DEPS").split() == no_deps
    assert "pip install --quiet --no-deps $(NO_DEPS)" in (REPO / "Makefile").read_text()
    env_no_deps = [p for line in re.findall(r"^#\s+pip install --no-deps (.+)$", env_text, re.MULTILINE)
                   for p in line.split()]
    assert env_no_deps == no_deps, f"--no-deps: environment.yml {env_no_deps}, pyproject.toml {no_deps}"
    # the kernel: the Makefile's install step, and environment.yml's instructions
    assert "ipykernel install --sys-prefix --name python3" in (REPO / "Makefile").read_text()
    assert re.search(r"^#\s+python -m ipykernel install --sys-prefix --name python3$", env_text, re.MULTILINE)

    # environment.yml's python satisfies the project's
    python = next(str(d) for d in env["dependencies"] if str(d).startswith("python"))
    version = re.fullmatch(r"python\s*=+\s*([\d.]+)", python).group(1)
    assert SpecifierSet(project["project"]["requires-python"]).contains(version)


def test_test_extra_keeps_flower():
    """`pip install -e .[test]` (docs/flower.md) still brings Flower and its simulation engine."""
    project = pyproject()
    extras = project["project"]["optional-dependencies"]
    flower = pinned(extras["flower"], project)
    assert {"flwr", "ray"} <= set(flower)
    assert pinned(extras["test"], project).items() >= flower.items()
