"""pFedBBN's study: the Table 1 grid over Dirichlet label skew with class-wise and major/minor-class accuracy
(``imbalance``) and the temperature x distance-scale study (``temperature``). The method itself is
``strategies/pfedbbn.py`` (server) and ``tta/bbn.py`` (the BBN client)."""
