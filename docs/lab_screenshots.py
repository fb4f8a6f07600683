"""Screenshot committed notebooks open in JupyterLab, each at its first figure, in headless Chromium.

    .venv/bin/python docs/lab_screenshots.py            # docs/screenshots/lab_10.png, lab_20.png, lab_90.png

Starts JupyterLab on the repository as ``make lab`` does (``tests/test_lab.py``'s ``lab_server``: the Makefile's
LAB_FLAGS and config file, 127.0.0.1, a token; Jupyter's config and runtime folders in a temporary directory, with
user settings that turn autosave and the news prompt off and render every cell) and headless Chromium
(``apt-get install chromium``) driven over its DevTools protocol (``docs/site_screenshots.py``'s ``DevTools``). Each
notebook is opened as it is committed (nothing is run: its outputs are the committed ones), its first inline figure
scrolled to the top of the notebook panel, and the window captured; a PNG over ``--max-kb`` is re-saved with a
256-colour palette. JupyterLab starts each notebook's kernel when it opens it; both processes are stopped at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "docs"), str(REPO / "tests")]
from site_screenshots import DevTools, finish, headless_chromium  # noqa: E402
from test_lab import lab_server  # noqa: E402  (JupyterLab started as `make lab` starts it)

NOTEBOOKS = {"10": "10_fedtsa", "20": "20_fedctta", "90": "90_leaderboard"}
FIRST_FIGURE = "document.querySelector('.jp-Notebook .jp-OutputArea-output img')"
CONTEXT_PX = 60  # shown above the figure: the end of the cell that drew it
SETTLE_TRIES = 10
# JupyterLab user settings for the screenshots: no autosave (nothing written while the page is open), no news
# prompt over the notebook, every cell rendered (so the first figure can be found and scrolled to)
SETTINGS: Dict[str, dict] = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def write_settings(config_dir: Path) -> None:
    """``SETTINGS`` as JupyterLab's user settings under the Jupyter config folder ``config_dir``."""
    for plugin, values in SETTINGS.items():
        path = config_dir / "lab" / "user-settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


async def shoot_notebook(tools: DevTools, url: str, out: Path, timeout: float) -> None:
    """Open the notebook at ``url`` (a fresh workspace), wait for its first figure, scroll it to the top of the
    notebook panel, save the window."""
    await tools.call("Page.navigate", url=url)
    end = time.time() + timeout
    while not await tools.js(f"!!{FIRST_FIGURE} && {FIRST_FIGURE}.complete"):
        if time.time() > end:
            raise SystemExit(f"{url}: no figure rendered in {timeout:.0f} s (is the notebook's first image inline?)")
        await asyncio.sleep(1.0)
    top = None
    for _ in range(SETTLE_TRIES):  # scroll until the figure stays put (cells above may still be laying out)
        await tools.js(f"{FIRST_FIGURE}.scrollIntoView({{block: 'start'}}); "
                       f"{FIRST_FIGURE}.closest('.jp-WindowedPanel-outer, .jp-Notebook').scrollBy(0, -{CONTEXT_PX})")
        await asyncio.sleep(1.0)
        now = await tools.js(f"Math.round({FIRST_FIGURE}.getBoundingClientRect().top)")
        if now == top:
            break
        top = now
    shot = await tools.call("Page.captureScreenshot", format="png")
    out.write_bytes(base64.b64decode(shot["data"]))


async def shoot_all(debug_port: int, base: str, token: str, names: List[str], out_dir: Path, width: int,
                    height: int, timeout: float) -> List[Path]:
    """One screenshot per notebook of ``names``, in one page of the running Chromium."""
    tools = await DevTools.connect(debug_port)
    await tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=False)
    written = []
    for number in names:
        out = out_dir / f"lab_{number}.png"
        await shoot_notebook(tools, f"{base}/lab/tree/notebooks/{NOTEBOOKS[number]}.ipynb?reset&token={token}", out,
                             timeout)
        written.append(out)
    return written


def main(argv: List[str] | None = None) -> int:
    """Screenshot each notebook asked for; prints each file with its size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", default=list(NOTEBOOKS), help=f"of {', '.join(NOTEBOOKS)}")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a notebook's figure")
    parser.add_argument("--max-kb", type=int, default=400, help="larger PNGs are re-saved with 256 colours")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args(argv)
    if not args.chromium:
        raise SystemExit("no chromium found (apt-get install chromium)")
    unknown = sorted(set(args.notebooks) - set(NOTEBOOKS))
    if unknown:
        raise SystemExit(f"no screenshot defined for notebook(s) {unknown}; known: {', '.join(NOTEBOOKS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lab-shots-") as scratch:
        write_settings(Path(scratch) / "jupyter" / "config")
        with lab_server(REPO, Path(scratch) / "jupyter") as lab:
            with headless_chromium(args.chromium, Path(scratch) / "chromium") as debug_port:
                written = asyncio.run(shoot_all(debug_port, lab.base, lab.token, args.notebooks, args.out,
                                                args.width, args.height, args.timeout))
    return finish(written, args.max_kb, REPO)


if __name__ == "__main__":
    sys.exit(main())
