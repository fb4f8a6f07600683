"""Screenshot the collaboration explorer as a user sees it: JupyterLab from .venv in headless Chromium.

    .venv/bin/python docs/explorer_screenshot.py --out figures/explorer_jupyterlab.png

Starts JupyterLab on the repository (127.0.0.1, a token, the project's python3 kernel; Jupyter's config and runtime
folders in a temporary directory, with autosave off so nothing is written) on the repository's
``examples/explorer.ipynb`` (the explorer cell of notebooks 12 and 90 on the stored case-study runs, paths relative
to ``examples/``), and headless Chromium (``apt-get install chromium``) with its DevTools protocol on a local port.
Over that protocol (tornado's websocket client, installed with Jupyter) it runs the notebook's cells, moves the step
slider with the keyboard (``--presses`` x ArrowRight) and captures the page. Both processes are stopped at the end,
and the script fails if the notebook's bytes changed.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOKEN = "explorer-screenshot"
NOTEBOOK = Path("examples") / "explorer.ipynb"  # relative to the repository, which JupyterLab serves
# JupyterLab user settings: no autosave, so running the notebook in the page writes nothing to the repository
SETTINGS = {"@jupyterlab/docmanager-extension/plugin": {"autosave": False}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 120.0) -> Any:
    """The JSON at ``url`` once it answers."""
    end = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read().decode())
        except OSError:
            if time.time() > end:
                raise
            time.sleep(1)


async def drive(debug_port: int, url: str, out: Path, presses: int) -> str:
    """Open ``url``, run all cells, press ArrowRight on the step slider ``presses`` times, save a screenshot;
    returns the slider's readout."""
    from tornado.websocket import websocket_connect

    page = next(t for t in wait_for(f"http://127.0.0.1:{debug_port}/json/list") if t["type"] == "page")
    ws = await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=1 << 28)
    counter = 0

    async def call(method: str, **params: Any) -> dict:
        nonlocal counter
        counter += 1
        ws.write_message(json.dumps({"id": counter, "method": method, "params": params}))
        while True:
            msg = json.loads(await ws.read_message())
            if msg.get("id") == counter:
                return msg

    async def js(expr: str) -> Any:
        r = await call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        return r.get("result", {}).get("result", {}).get("value")

    async def until(expr: str, timeout: float) -> None:
        end = time.time() + timeout
        while not await js(expr):
            if time.time() > end:
                raise TimeoutError(expr)
            await asyncio.sleep(1)

    await call("Emulation.setDeviceMetricsOverride", width=1500, height=960, deviceScaleFactor=1, mobile=False)
    await call("Page.navigate", url=url)
    await until("!!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))", 120)
    await asyncio.sleep(5)  # the kernel starts
    await js("jupyterapp.commands.execute('notebook:run-all-cells').then(() => true)")
    await until("!!document.querySelector('.widget-image')", 180)
    await js("[...document.querySelectorAll('button')].filter(b => b.textContent.trim() == 'No').map(b => b.click())")
    await js("document.querySelector('.widget-slider .noUi-handle').focus()")
    for _ in range(presses):
        for kind in ("rawKeyDown", "keyUp"):
            await call("Input.dispatchKeyEvent", type=kind, key="ArrowRight", code="ArrowRight",
                       windowsVirtualKeyCode=39)
        await asyncio.sleep(0.05)
    await asyncio.sleep(8)  # the kernel redraws
    shot = await call("Page.captureScreenshot", format="png")
    out.write_bytes(base64.b64decode(shot["result"]["data"]))
    return await js("document.querySelector('.widget-readout').textContent")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "figures" / "explorer_jupyterlab.png")
    p.add_argument("--notebook", type=Path, default=NOTEBOOK, help="relative to the repository")
    p.add_argument("--presses", type=int, default=50)
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = p.parse_args()
    if not args.chromium:
        raise SystemExit("no chromium found (apt-get install chromium)")
    import hashlib

    notebook = REPO / args.notebook
    before = hashlib.sha256(notebook.read_bytes()).hexdigest()
    work = Path(tempfile.mkdtemp(prefix="explorer-shot-"))
    for plugin, values in SETTINGS.items():
        path = work / "config" / "lab" / "user-settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    lab_port, debug_port = free_port(), free_port()
    env = {**os.environ, "JUPYTER_PREFER_ENV_PATH": "1", "JUPYTER_CONFIG_DIR": str(work / "config"),
           "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(work / "config" / "lab" / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(work / "workspaces")}
    root = ["--allow-root"] if os.geteuid() == 0 else []
    lab = subprocess.Popen([sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={REPO}", "--no-browser",
                            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={lab_port}",
                            f"--IdentityProvider.token={TOKEN}", "--LabApp.expose_app_in_browser=True",
                            "--MappingKernelManager.default_kernel_name=python3", *root],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    chrome = subprocess.Popen([args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                               f"--remote-debugging-port={debug_port}", f"--user-data-dir={work / 'chrome'}",
                               "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{lab_port}/api/status?token={TOKEN}")
        url = f"http://127.0.0.1:{lab_port}/lab/tree/{args.notebook.as_posix()}?token={TOKEN}"
        readout = asyncio.run(drive(debug_port, url, args.out, args.presses))
        print(f"saved {args.out} (step slider at {readout})")
    finally:
        stop(chrome)
        stop(lab)
        shutil.rmtree(work, ignore_errors=True)
    if hashlib.sha256(notebook.read_bytes()).hexdigest() != before:
        raise SystemExit(f"{args.notebook} changed while it was open: autosave was not off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
