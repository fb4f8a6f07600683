"""Before/after images of the ten figures a reviewer sent back (issue 54, point 9): each figure as committed before
it was redone (the blob at ``BEFORE``, from git) beside the figure committed now, one PNG per figure in
``docs/screenshots/before_after/`` and the page ``docs/figures-before-after.md`` that shows them.

    .venv/bin/python docs/figures_before_after.py

Needs the git history (a shallow clone without ``BEFORE`` stops with one line saying so).
"""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BEFORE = "5badb34^"  # the commit before the figures were redone to ftta_core/style.py's standard
OUT = REPO / "docs" / "screenshots" / "before_after"
PAGE = REPO / "docs" / "figures-before-after.md"
# (figure, what a reviewer objected to: issue 54 point 9)
FIGURES: List[Tuple[str, str]] = [
    ("figures/leaderboard/leaderboard_fedtsa_niid.png",
     "a row 'not run', a clipped colour scale (59.0 and 65.0 the same colour), n per cell not shown"),
    ("figures/fedtsa_table1/table1_grad_drift.png",
     "one strategy at -33 squashed every other gain; the tie band invisible; a jargon title"),
    ("figures/fedtsa_table1/source_model_conclusions.png", "8 panels, raw checkpoint ids in the legend"),
    ("figures/fedtsa_table1/tta_grad_step_size.png", "'1-5 seed(s)' without saying which; mismatched font sizes"),
    ("figures/fedtsa_ablations/fig4_robustness_bn.png", "one seed, a legend promising +-1 sd"),
    ("figures/leaderboard/participation_fedtsa_niid.png", "two near-identical oranges and pinks"),
    ("figures/pfedbbn/temperature_curve.png", "a cryptic legend"),
    ("figures/fedtsa_ablations/fig3_variants_bn.png", "bars from 0 hid 65-74 % differences"),
    ("figures/fedacross/cifar10c_accuracy_vs_k.png", "every adapted curve below no adaptation, not commented"),
    ("figures/explorer_jupyterlab.png", "a machine path and a notebook not in the repository"),
]


def committed_png(rev: str, path: str):
    """The image array of ``path`` at git revision ``rev``."""
    blob = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, check=False)
    if blob.returncode != 0:
        raise SystemExit(f"figures_before_after: cannot read {path} at {rev} (a shallow clone? "
                         f"git fetch --unshallow): {blob.stderr.decode().strip()}")
    return mpimg.imread(io.BytesIO(blob.stdout), format="png")


def side_by_side(path: str, before_rev: str, after_rev: str) -> Path:
    """Write the before|after image of ``path`` and return where."""
    before, after = committed_png(before_rev, path), committed_png(after_rev, path)
    height = max(before.shape[0], after.shape[0])
    width = before.shape[1] + after.shape[1]
    fig, axes = plt.subplots(1, 2, figsize=(min(width / 100, 24), min(height / 100, 12) + 0.5),
                             gridspec_kw={"width_ratios": [before.shape[1], after.shape[1]]})
    for ax, image, title in zip(axes, (before, after), (f"before ({before_rev})", f"after ({after_rev})")):
        ax.imshow(image)
        ax.set_title(title, fontsize=11)
        ax.axis("off")
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / (path.replace("figures/", "").replace("/", "__"))
    fig.savefig(target, dpi=80)
    plt.close(fig)
    return target


def main() -> int:
    after = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    lines = ["# Figures before and after", "",
             "The ten figures a reviewer sent back, as committed before they were redone to the standard of "
             "`ftta_core/style.py` (left, the commit before 5badb34) and as committed now (right). Made by "
             "`.venv/bin/python docs/figures_before_after.py` from the git history; the objection each answers "
             "is the reviewer's.", ""]
    for path, objection in FIGURES:
        target = side_by_side(path, BEFORE, after)
        lines += [f"## `{path}`", "", f"Objection: {objection}.", "",
                  f"![{path}: before and after](screenshots/before_after/{target.name})", ""]
    PAGE.write_text("\n".join(lines))
    print(f"{len(FIGURES)} figures -> {OUT.relative_to(REPO)}, {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
