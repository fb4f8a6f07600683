"""Gallery figure: one image under the 15 CIFAR-10-C corruptions at the 5 severities (15 rows x 6 columns)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Optional, Union

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from .corruptions import CORRUPTIONS, SEVERITIES, corrupt_uint8

PathLike = Union[str, Path]
DEFAULT_GALLERY_INDEX = 13  # CIFAR-10 test image 13: a white horse on a dark background (clear under every corruption)
_CELL_INCHES = 0.95


def corruption_gallery(image: np.ndarray, seed: int = 0, path: Optional[PathLike] = None) -> Figure:
    """Draw uint8 HWC ``image`` clean and under every corruption x severity; save to ``path`` when given."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3], got {image.dtype} {image.shape}")
    rows, cols = len(CORRUPTIONS), len(SEVERITIES) + 1
    fig = Figure(figsize=(cols * _CELL_INCHES + 1.2, rows * _CELL_INCHES + 0.4), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False)
    for r, name in enumerate(CORRUPTIONS):
        # every severity uses the same per-image seed, so within a row only the constants change
        panels = [image] + [corrupt_uint8(image[None], name, s, seed=[seed])[0] for s in SEVERITIES]
        for c, panel in enumerate(panels):
            ax = axes[r, c]
            ax.imshow(panel, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title("clean" if c == 0 else f"severity {c}", fontsize=8)
        axes[r, 0].set_ylabel(name.replace("_", " "), fontsize=8, rotation=0, ha="right", va="center")
    fig.subplots_adjust(left=0.17, right=0.99, top=0.975, bottom=0.005, wspace=0.05, hspace=0.08)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    return fig


def load_cifar10_test_image(index: int, root: Optional[PathLike] = None) -> np.ndarray:
    """CIFAR-10 test image ``index`` as uint8 HWC, decoded with Pillow from the shared packed archive."""
    from .data.root import data_root

    archive = Path(data_root(root)) / "cifar10" / "cifar10_jpeg.npz"
    if not archive.is_file():
        raise FileNotFoundError(f"CIFAR-10 archive not found at {archive} (set FTTA_DATA_ROOT or pass root=)")
    with np.load(archive) as packed:
        offsets = packed["test_offsets"]
        if not 0 <= index < len(offsets) - 1:
            raise IndexError(f"test index {index} out of range 0..{len(offsets) - 2}")
        data = packed["test_jpeg"][offsets[index] : offsets[index + 1]]
    with Image.open(io.BytesIO(data.tobytes())) as decoded:
        return np.asarray(decoded.convert("RGB"))


def write_gallery(
    path: PathLike, index: int = DEFAULT_GALLERY_INDEX, seed: int = 0, root: Optional[PathLike] = None
) -> Figure:
    """Decode CIFAR-10 test image ``index`` and save its corruption gallery to ``path``."""
    return corruption_gallery(load_cifar10_test_image(index, root), seed=seed, path=path)
