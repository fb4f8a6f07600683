"""FedTSA's study (Zhang et al.): Table 1 (``table1``: configs, stored runs, the paper's claims, the TTA-grad 2x2) and
the case study of Table 4 / Figs 5-6 (``case_study``). The method itself is ``strategies/fedtsa.py`` and
``strategies/ts_block.py``; notebooks 10-12 and the ``study fedtsa table``, ``study fedtsa grad-cells`` and ``study fedtsa case-study`` commands
use this package."""
