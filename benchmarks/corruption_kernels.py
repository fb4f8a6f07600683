"""CIFAR-10-C corruption kernels: our batched torch ``corrupt`` vs the NumPy/SciPy/Pillow reference, image by image.

For each of the 15 corruptions at one severity (5 by default), on the first ``--images`` CIFAR-10 test images (the
project's loader; seeded synthetic images when the data are absent, said in the output):

* ours: ``corrupt(batch, name, severity, seed=image_seeds(0, n))`` on the whole batch (float32 in [0, 1], on
  ``--device``; CUDA is synchronised). The time includes the per-image random-field draw that ``corrupt`` does on
  the CPU, the float64 work and the quantisation;
* reference: ``tests/corruption_reference.apply_reference`` (the transcription of Hendrycks' make_cifar_c.py), one
  image at a time as the original does, with the same random fields; drawing those fields
  (``draw_fields(get_spec(name), severity, seeds, 32, 32)``) is timed separately and NOT included in its time.

Each side gets one warm-up call on a few images, then the median of ``--repeats`` timed calls (``time.perf_counter``).
Reported per corruption: images/s of each, the speed-up (reference time / our time), and the agreement of the uint8
outputs (max |difference| in levels, % of values that differ); plus a total row over all 15 corruptions. Absolute
numbers depend on the machine and its load: compare the ratios within one run.

    OMP_NUM_THREADS=1 python benchmarks/corruption_kernels.py [--device cpu|cuda] [--images 100] [--severity 5]
        [--repeats 5] [--out FILE]

Writes benchmarks/results/corruption_kernels_<device>.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Tuple

import numpy as np
import torch

from ftta_core.corruptions import CORRUPTIONS, SEVERITIES, corrupt, get_spec, image_seeds
from ftta_core.corruptions.registry import draw_fields
from ftta_core.data.cifar import load_cifar10
from ftta_core.data.root import DatasetNotFoundError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import corruption_reference as ref  # noqa: E402
from results_io import device_name, write_results  # noqa: E402

SEED = 0  # corrupt(..., seed=image_seeds(SEED, n)); the synthetic images use the same seed
WARMUP_IMAGES = 4


def load_images(n: int) -> Tuple[np.ndarray, str]:
    """The first ``n`` CIFAR-10 test images (uint8 NHWC), else ``n`` seeded synthetic images; with their source."""
    try:
        images = load_cifar10("test").images[:n]
        return np.ascontiguousarray(images), f"CIFAR-10 test images 0..{len(images) - 1}"
    except DatasetNotFoundError:
        return synthetic_images(n), f"{n} synthetic images (seed {SEED}; CIFAR-10 not found)"


def synthetic_images(n: int, size: int = 32) -> np.ndarray:
    """Seeded natural-ish uint8 images [n, size, size, 3]: a colour gradient, a bright disc and pixel noise."""
    rng = np.random.default_rng(SEED)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = []
    for _ in range(n):
        start, end, disc_colour = rng.uniform(0, 255, (3, 3))
        theta = rng.uniform(0, 2 * np.pi)
        t = np.clip(0.5 + (xx - 0.5) * np.cos(theta) + (yy - 0.5) * np.sin(theta), 0, 1)[..., None]
        img = start * (1 - t) + end * t
        cy, cx, r = rng.uniform(0.2, 0.8, 3)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 <= (r / 3) ** 2] = disc_colour
        out.append(np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8))
    return np.stack(out)


def to_tensor(images_uint8: np.ndarray, device: str) -> torch.Tensor:
    """uint8 NHWC -> float32 NCHW in [0, 1] on ``device``."""
    return (torch.from_numpy(images_uint8).permute(0, 3, 1, 2).float() / 255.0).to(device)


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """Quantised float NCHW -> uint8 NHWC (on the CPU)."""
    return torch.round(x.cpu() * 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def timed(call: Callable[[], object], repeats: int, device: str) -> Tuple[float, object]:
    """Median seconds of ``repeats`` calls (CUDA synchronised before and after each) and the last result."""
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = call()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def measure(name: str, severity: int, images: np.ndarray, device: str, repeats: int) -> dict:
    """Time ours (whole batch) and the reference (image by image) on ``images``; compare their uint8 outputs."""
    n = len(images)
    x = to_tensor(images, device)
    seeds = image_seeds(SEED, n)
    spec = get_spec(name)
    # warm-up: one call of each on a few images
    corrupt(x[:WARMUP_IMAGES], name, severity, seed=seeds[:WARMUP_IMAGES])
    ref.apply_reference(name, severity, images[:WARMUP_IMAGES],
                        draw_fields(spec, severity, seeds[:WARMUP_IMAGES], 32, 32))
    ours_s, ours = timed(lambda: corrupt(x, name, severity, seed=seeds), repeats, device)
    draw_s, fields = timed(lambda: draw_fields(spec, severity, seeds, 32, 32), repeats, "cpu")
    ref_s, theirs = timed(lambda: ref.apply_reference(name, severity, images, fields), repeats, "cpu")
    diff = np.abs(to_uint8(ours).astype(np.int16) - theirs.astype(np.int16))
    return {"corruption": name, "ours_s": ours_s, "reference_s": ref_s, "reference_draw_s": draw_s,
            "ours_images_per_s": n / ours_s, "reference_images_per_s": n / ref_s, "speedup": ref_s / ours_s,
            "max_abs_diff": int(diff.max()), "differ_values": int((diff > 0).sum()), "values": int(diff.size),
            "percent_differ": 100.0 * float((diff > 0).mean())}


def total_row(rows: list, n: int) -> dict:
    """All corruptions together: summed times, images/s over 15 x n corrupted images, pooled agreement."""
    ours_s, ref_s = sum(r["ours_s"] for r in rows), sum(r["reference_s"] for r in rows)
    differ, values = sum(r["differ_values"] for r in rows), sum(r["values"] for r in rows)
    return {"corruption": "total", "ours_s": ours_s, "reference_s": ref_s,
            "reference_draw_s": sum(r["reference_draw_s"] for r in rows),
            "ours_images_per_s": len(rows) * n / ours_s, "reference_images_per_s": len(rows) * n / ref_s,
            "speedup": ref_s / ours_s, "max_abs_diff": max(r["max_abs_diff"] for r in rows),
            "differ_values": differ, "values": values, "percent_differ": 100.0 * differ / values}


def command_line() -> str:
    """The command as run: thread variables that were set, the interpreter (relative to the repo) and arguments."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ)
    python = Path(sys.executable)
    try:
        python = python.relative_to(REPO)
    except ValueError:
        python = Path("python")
    script = Path(__file__).resolve().relative_to(REPO)
    return " ".join(filter(None, [env, str(python), str(script), *map(shlex.quote, sys.argv[1:])]))


def markdown(result: dict) -> str:
    """The table written next to the JSON, its first line naming the command."""
    lines = [f"Made by: `{result['command']}`", "",
             f"{result['device_name']} ({result['device']}, {result['torch_threads']} torch thread(s)), torch "
             f"{result['torch']}, {result['date']}. {result['images_source']}, severity {result['severity']}; "
             f"median of {result['repeats']} timed calls after one warm-up. Ours: `corrupt` on the whole batch "
             f"(random-field draw included). Reference: `tests/corruption_reference.apply_reference`, image by image, "
             f"with the same fields; their draw (column 'fields draw') is NOT in its time. Speed-up = reference time / "
             f"our time. Agreement on the uint8 outputs. The machine was shared with other jobs: compare ratios "
             f"within this run, not absolute images/s.", "",
             "| corruption | ours images/s | reference images/s | speed-up | fields draw (s) | max abs diff | "
             "% values differ |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"] + [result["total"]]:
        bold = "**" if r["corruption"] == "total" else ""
        lines.append(f"| {bold}{r['corruption']}{bold} | {r['ours_images_per_s']:,.0f} | "
                     f"{r['reference_images_per_s']:,.0f} | {bold}{r['speedup']:.2f}x{bold} | "
                     f"{r['reference_draw_s']:.3f} | {r['max_abs_diff']} | {r['percent_differ']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the reference always runs on the CPU)")
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--severity", type=int, default=5, choices=SEVERITIES)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per side; the median is reported")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    images, source = load_images(args.images)
    print(f"{source}; severity {args.severity}; device {args.device}; {torch.get_num_threads()} torch thread(s)",
          flush=True)
    rows = []
    for name in CORRUPTIONS:
        r = measure(name, args.severity, images, args.device, args.repeats)
        rows.append(r)
        print(f"{name:18s} ours {r['ours_images_per_s']:8.0f} img/s   reference {r['reference_images_per_s']:8.0f} "
              f"img/s   speed-up {r['speedup']:6.2f}x   max diff {r['max_abs_diff']}   differ "
              f"{r['percent_differ']:.3f} %", flush=True)
    total = total_row(rows, len(images))
    print(f"{'total':18s} ours {total['ours_images_per_s']:8.0f} img/s   reference "
          f"{total['reference_images_per_s']:8.0f} img/s   speed-up {total['speedup']:6.2f}x", flush=True)
    result = {"command": command_line(), "device": args.device, "device_name": device_name(args.device),
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "images": len(images), "images_source": source,
              "severity": args.severity, "repeats": args.repeats, "seed": SEED,
              "reference_time_includes_draw": False, "ours_time_includes_draw": True, "rows": rows, "total": total}
    write_results(result, "corruption_kernels", args.device, markdown(result), args.out)


if __name__ == "__main__":
    main()
