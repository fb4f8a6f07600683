"""Pack what a CIFAR-10-C run needs on a machine without ``../shared`` (e.g. a lent GPU machine) into one folder.

Writes ``OUT/data/cifar-10-batches-py/{test_batch,batches.meta}`` (the CIFAR-10 test split as decoded here, in the
python-batch layout ``load_cifar10`` reads, so the corruption cache digests match) and
``OUT/site/imagecorruptions/frost/`` (the frost textures, without the package's heavy imports) and
``OUT/cache/eata_source/`` (EATA's Fisher draws of CIFAR-10 training images for seeds 0-4, ``tta.eata``: the bundle
has no training split). About 40 MB. There:

    export FTTA_DATA_ROOT=$PWD/OUT/data PYTHONPATH=$PWD:$PWD/OUT/site
    cp -a OUT/cache/. $FTTA_CACHE_DIR/    # benchmarks/device_run.sh does this

Usage: python benchmarks/device_bundle.py --out .gpu   (add the folder to .git/info/exclude and carry it)
"""
from __future__ import annotations

import argparse
import importlib.util
import pickle
import shutil
from pathlib import Path

import numpy as np


def write_cifar10_test(out: Path) -> None:
    """The test split as a CIFAR python batch (rows of 3 planes of 32x32) plus its label names."""
    from ftta_core.data.cifar import load_cifar10

    test = load_cifar10("test")
    folder = out / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rows = np.ascontiguousarray(np.asarray(test.images).transpose(0, 3, 1, 2).reshape(len(test.labels), -1))
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": rows.astype(np.uint8), b"labels": [int(y) for y in test.labels]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in test.class_names]}, f)


def write_frost_textures(out: Path) -> None:
    """The imagecorruptions frost images under a stub package (nothing of the package is imported)."""
    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or spec.origin is None:
        raise SystemExit("imagecorruptions is not installed here (make install puts it in .venv)")
    target = out / "site" / "imagecorruptions"
    shutil.copytree(Path(spec.origin).parent / "frost", target / "frost", dirs_exist_ok=True)
    (target / "__init__.py").write_text("")


def write_eata_source_images(out: Path, seeds: range = range(5)) -> None:
    """EATA's Fisher images of the CIFAR-10 source model (its default draw size) for ``seeds``, as its cache files."""
    import inspect
    import os

    from ftta_core.experiment import ExperimentConfig
    from ftta_core.tta.eata import EATA, load_source_images

    samples = inspect.signature(EATA).parameters["fisher_samples"].default
    before = os.environ.get("FTTA_CACHE_DIR")
    os.environ["FTTA_CACHE_DIR"] = str(out / "cache")
    try:
        for seed in seeds:
            load_source_images(ExperimentConfig(dataset="cifar10").model_name, samples, seed)
        for path in (out / "cache").iterdir():  # the decoded training split cached on the way (~150 MB): not needed
            if path.name != "eata_source":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    finally:
        os.environ.pop("FTTA_CACHE_DIR") if before is None else os.environ.__setitem__("FTTA_CACHE_DIR", before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".gpu"))
    args = parser.parse_args()
    write_cifar10_test(args.out)
    write_frost_textures(args.out)
    write_eata_source_images(args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({size / 2**20:.1f} MB)")


if __name__ == "__main__":
    main()
