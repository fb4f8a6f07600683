"""What every benchmark script does with its numbers: name the device, write ``results/<name>_<kind>.json`` and the
markdown table beside it."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the processor's (``cpu`` when the platform does not say)."""
    return torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu"


def write_results(result: Mapping[str, Any], name: str, device: str, markdown: str, out: Optional[Path] = None,
                  indent: int = 2) -> Path:
    """Write ``result`` as JSON to ``out`` (default ``results/<name>_<device kind>.json``) and ``markdown`` to the
    same path with ``.md``; print both paths and return the JSON's."""
    out = out or RESULTS / f"{name}_{device.split(':')[0]}.json"
    out.write_text(json.dumps(result, indent=indent) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return out


def run_metadata(device: str) -> dict:
    """What to store with a measurement: command, date, commit, device name, load average at the time of the call."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return {"command": "python " + " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
            "date": datetime.date.today().isoformat(), "commit": commit, "device": device,
            "device_name": device_name(device), "torch": torch.__version__,
            "load_average": [round(v, 2) for v in os.getloadavg()]}
