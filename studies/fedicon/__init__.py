"""FedICON's study (Tan et al.): its tables beside the paper's and their readings (``report``). The method, its
baselines and their runner are ``ftta_core/fedicon/``; notebook 40 and ``python -m ftta_core study fedicon`` use
this package."""
