"""Keep the memory a step frees for the next step (glibc's malloc), instead of handing it back to the OS.

A step of the vectorized bank allocates and frees the same large tensors every time: the clients' stacked
parameters are a few hundred MB (all of ResNet-8 x 20 clients: ~96 MB per copy), and the state snapshot, the
gradients, the mixed state and the activations are all fresh tensors. glibc serves a block above its mmap threshold
(at most 32 MiB, adjusted as blocks are freed) with its own ``mmap`` and unmaps it on ``free``, and trims the heap's
top back to the OS; the next step then faults every page in again, zeroed by the kernel (~40,000 page faults per
step of the drift cell with FedAvg). ``keep_freed_memory`` raises the mmap threshold, the trim threshold and the
top pad (``mallopt``), so freed blocks stay in the heap and are reused: memory held by the process stays near its
peak, and the numbers do not change (torch's CPU allocator aligns every block to 64 bytes either way;
``tests/test_allocator.py`` checks a run bit for bit). ``benchmarks/allocator.py`` measures the effect.

The CLI applies it in every process that runs experiments (``cli.main``, each ``run-plan`` worker);
``FTTA_KEEP_MEMORY=0`` turns it off. A process that is not on glibc (macOS, Windows, musl) is left as it is.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

KEEP_MEMORY_ENV = "FTTA_KEEP_MEMORY"
# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 256 * 2**20  # blocks up to this size come from the heap (the largest stacked tensor: ~47 MB)
TRIM_THRESHOLD = 2**31 - 1  # free memory at the heap's top kept up to this (the largest value mallopt takes)
TOP_PAD = 64 * 2**20  # extra heap requested at each growth


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory in the process (module docstring). Returns True when applied;
    False off glibc, when ``$FTTA_KEEP_MEMORY`` is '0', or when ``mallopt`` refuses a value."""
    if os.environ.get(KEEP_MEMORY_ENV, "1") == "0" or platform.system() != "Linux" \
            or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)
