"""Screenshot the built site in headless Chromium: its landing page, and notebook 10 at its first figure.

    make docs-screenshots        # builds site/ (make docs), then this
    .venv/bin/python docs/site_screenshots.py --site site --out docs/screenshots

Opens the built pages from disk (``file://``, nothing served) in headless Chromium (``apt-get install chromium``; CI
does not need it), driven over its DevTools protocol (tornado's websocket client, installed with Jupyter), and writes
``site_landing.png`` (``index.html``, top of the page) and ``site_notebook_10.png`` (``notebooks/10_fedtsa.html``
scrolled so that its first inline figure is in the middle: the navigation, the figure and the text around it in one
picture). ``chromium --screenshot`` alone cannot do the second: with the page scrolled it paints the viewport below a
blank band. A PNG over ``--max-kb`` is re-saved with a 256-colour palette.
"""
from __future__ import annotations

import argparse
import contextlib
import asyncio
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from explorer_screenshot import free_port, stop, wait_for  # noqa: E402  (the sibling script's process helpers)

# (file name, page of the site, whether to scroll its first inline figure to the middle)
SHOTS = (("site_landing.png", "index.html", False), ("site_notebook_10.png", "notebooks/10_fedtsa.html", True))
FIRST_FIGURE = "document.querySelector('img[src^=\"data:image/\"]')"


class DevTools:
    """One page of a Chromium started with ``--remote-debugging-port``, driven over its websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.counter = ws, 0

    @classmethod
    async def connect(cls, debug_port: int) -> DevTools:
        from tornado.websocket import websocket_connect

        page = next(t for t in wait_for(f"http://127.0.0.1:{debug_port}/json/list") if t["type"] == "page")
        return cls(await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=1 << 28))

    async def call(self, method: str, **params: Any) -> dict:
        """Send one command; its result."""
        self.counter += 1
        self.ws.write_message(json.dumps({"id": self.counter, "method": method, "params": params}))
        while True:
            message = json.loads(await self.ws.read_message())
            if message.get("id") == self.counter:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def shoot(self, url: str, out: Path, at_figure: bool, timeout: float = 60.0) -> None:
        """Open ``url``, wait until it has loaded, scroll its first inline figure to the middle if asked, save."""
        await self.call("Page.navigate", url=url)
        end = time.time() + timeout
        while await self.js("document.readyState") != "complete":
            if time.time() > end:
                raise SystemExit(f"{url} did not finish loading in {timeout:.0f} s")
            await asyncio.sleep(0.5)
        if at_figure and not await self.js(f"!!{FIRST_FIGURE}"):
            raise SystemExit(f"{url}: no inline figure (<img src=\"data:image/...\">)")
        if at_figure:
            await self.js(f"{FIRST_FIGURE}.scrollIntoView({{block: 'center'}})")
        await asyncio.sleep(1.0)  # the theme's sticky navigation settles
        shot = await self.call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))


async def shoot_all(debug_port: int, site: Path, out_dir: Path, width: int, height: int) -> list[Path]:
    """Every shot of ``SHOTS``, in one page of the running Chromium."""
    tools = await DevTools.connect(debug_port)
    await tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=False)
    written = []
    for name, page, at_figure in SHOTS:
        path = site / page
        if not path.is_file():
            raise SystemExit(f"{path} missing: build the site first (make docs)")
        await tools.shoot(path.as_uri(), out_dir / name, at_figure)
        written.append(out_dir / name)
    return written


def shrink(path: Path, max_kb: int) -> None:
    """Re-save ``path`` with a 256-colour palette when it is over ``max_kb`` KB."""
    if path.stat().st_size <= max_kb * 1024:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def finish(written: list[Path], max_kb: int, root: Path | None = None) -> int:
    """Shrink each screenshot to ``max_kb`` and print it (relative to ``root`` when inside it) with its size."""
    for path in written:
        shrink(path, max_kb)
        shown = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
        print(f"{shown} ({path.stat().st_size // 1024} KB)")
    return 0


@contextlib.contextmanager
def headless_chromium(binary: str, profile: Path) -> Iterator[int]:
    """A headless Chromium with its DevTools port (yielded) and its profile in ``profile``; stopped on exit."""
    debug_port = free_port()
    chrome = subprocess.Popen([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", f"--remote-debugging-port={debug_port}", f"--user-data-dir={profile}",
                               "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield debug_port
    finally:
        stop(chrome)


def main(argv: list[str] | None = None) -> int:
    """Screenshot each page of ``SHOTS``; prints each file with its size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"), help="the built site (make docs)")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2000)
    parser.add_argument("--max-kb", type=int, default=400, help="larger PNGs are re-saved with 256 colours")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args(argv)
    if not args.chromium:
        raise SystemExit("no chromium found (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="site-shots-") as profile, \
            headless_chromium(args.chromium, Path(profile)) as debug_port:
        written = asyncio.run(shoot_all(debug_port, args.site.resolve(), args.out, args.width, args.height))
    return finish(written, args.max_kb)


if __name__ == "__main__":
    sys.exit(main())
