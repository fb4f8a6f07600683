"""FedTSA's study (Zhang et al.): Table 1 (``table1``: configs, stored runs, the paper's claims, the TTA-grad 2x2),
the case study of Table 4 / Figs 5-6 (``case_study``), the pre-registered step-size rule (``step_rule``), the source
regime (``source_regime``) and FedAvg+FT as the reference code reads it (``ft_forward``). The method itself is
``ftta_core/strategies/fedtsa.py`` and ``ts_block.py``; notebooks 10-12 and ``python -m ftta_core study fedtsa``
use this package."""
