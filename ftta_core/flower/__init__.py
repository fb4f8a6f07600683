"""ftta on Flower (flwr 1.41, Message API): FedAcross+ and a generic adapter for any local method + strategy.

Runs in process through ``LocalGrid`` (Flower's simulation engine needs Ray, which is not installed here).
"""
from .engine_app import FlowerRun, engine_client_app, engine_server_app, run_engine_on_flower
from .fedacross_app import FedAcrossRun, fedacross_client_app, fedacross_server_app, run_fedacross_on_flower
from .grid import LocalGrid, run_inprocess

__all__ = ["FlowerRun", "FedAcrossRun", "LocalGrid", "engine_client_app", "engine_server_app", "fedacross_client_app",
           "fedacross_server_app", "run_engine_on_flower", "run_fedacross_on_flower", "run_inprocess"]
