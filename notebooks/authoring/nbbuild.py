"""Build a notebook from a list of ("md"|"code"|"params", source) cells (used to author notebooks/)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Tuple

import nbformat


def build(cells: List[Tuple[str, str]], path: Path) -> None:
    """Write the cells as a notebook; the 'params' cell is tagged ``parameters`` for papermill."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, src in cells:
        src = src.strip("\n")
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(src))
        else:
            cell = nbformat.v4.new_code_cell(src)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
            nb.cells.append(cell)
    nbformat.write(nb, str(path))


if __name__ == "__main__":
    sys.exit("import build() from this module")
