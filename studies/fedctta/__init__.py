"""FedCTTA's study (Rajib et al.): its tables beside ours (``tables``), the live variants of Table IV, the interval,
temperature and batch-size studies and the reading of notebook 20 (``study``), and the server's cost against
FedTSA's (``server_cost``). The method itself is ``strategies/fedctta.py``."""
