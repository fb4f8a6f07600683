"""Office-Caltech-10 loader (4 domains x 10 shared classes; images of varying size resized to ``size x size``).

Formats read, first match wins:

* an ImageFolder tree ``<root>/office_caltech10/<domain>/<class>/*.jpg`` (class names = sorted sub-folder names,
  images in sorted file order; not verified, since the manifest describes the packed archive);
* the packed archive ``<root>/office_caltech10/office_caltech10_jpeg.npz`` (keys ``{d}_jpeg, {d}_offsets,
  {d}_labels, {d}_files, class_names, domain_names``), verified against MANIFEST.json: ``pixels_sha256`` is the
  SHA-256 of the concatenated bytes of every image decoded with Pillow and converted to RGB *at its original size*,
  in archive order (reproduced exactly), plus ``n`` and ``class_counts``.

Every image is converted to RGB first (4 caltech10 images are grayscale) and then resized to ``size x size`` with
Pillow's bilinear filter, ignoring the aspect ratio (929 of the 1,123 caltech10 images are not square). Resized
arrays are cached per size.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
from PIL import Image

from .base import ImageArray
from .cache import cached_arrays, load_packed, pil_to_array, read_npz
from .root import DatasetNotFoundError, PathLike, data_root, manifest_entry
from ..validation import check_choice

OFFICE_DOMAINS = ("amazon", "caltech10", "dslr", "webcam")
OFFICE_FOLDER = "office_caltech10"
OFFICE_PACKED = f"{OFFICE_FOLDER}/office_caltech10_jpeg.npz"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
OFFICE_HOW_TO_GET = (
    f"set FTTA_DATA_ROOT (or pass root=) to a folder containing the packed '{OFFICE_PACKED}' of the shared data "
    f"folder (../shared/data on the project machines), or an ImageFolder tree '{OFFICE_FOLDER}/<domain>/<class>/*.jpg' "
    f"(e.g. the images/ folder of github.com/redhat12345/OfficeCaltechDomainAdaptation)."
)


def load_office_caltech10(domain: str, root: PathLike | None = None, size: int = 64) -> ImageArray:
    """All images of one Office-Caltech-10 ``domain`` as RGB uint8 [N, size, size, 3] with labels 0..9."""
    check_choice("domain", domain, OFFICE_DOMAINS)
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    base = data_root(root)
    name = f"office_caltech10/{domain}"
    tree = base / OFFICE_FOLDER / domain
    if tree.is_dir():
        return _load_image_folder(name, tree, size)
    archive = base / OFFICE_PACKED
    if not archive.is_file():
        raise DatasetNotFoundError(f"Office-Caltech-10 domain '{domain}'", [tree, archive], base, OFFICE_HOW_TO_GET)
    (class_names,) = read_npz(archive, ["class_names"])
    images, labels = load_packed(
        archive,
        (f"{domain}_jpeg", f"{domain}_offsets", f"{domain}_labels"),
        name=name,
        entry=manifest_entry(base, name),
        size=size,
        num_classes=len(class_names),
    )
    return ImageArray(name, images, labels, [str(c) for c in class_names])


def _load_image_folder(name: str, tree: Path, size: int) -> ImageArray:
    """An ImageFolder tree ``tree/<class>/<image>`` decoded to RGB, resized, and cached by the files' sizes/mtimes."""
    class_names = sorted(p.name for p in tree.iterdir() if p.is_dir())
    files = [
        (label, path)
        for label, cls in enumerate(class_names)
        for path in sorted((tree / cls).iterdir())
        if path.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not files:
        raise DatasetNotFoundError(name, [tree / "<class>" / "*.jpg"], tree.parent.parent, OFFICE_HOW_TO_GET)
    stats = [(str(p.relative_to(tree)), p.stat().st_size, p.stat().st_mtime_ns) for _, p in files]
    fingerprint = {"tree": str(tree.resolve()), "files": stats, "size": size}

    def build() -> dict:
        images = []
        for _, path in files:
            with Image.open(path) as image:
                images.append(pil_to_array(image, "RGB", size))
        return {"images": np.stack(images), "labels": np.array([lab for lab, _ in files], dtype=np.int64)}

    arrays = cached_arrays(name, fingerprint, ("images", "labels"), build)
    return ImageArray(name, arrays["images"], arrays["labels"], class_names)


__all__: List[str] = ["load_office_caltech10", "OFFICE_DOMAINS"]
