"""ftta on Flower (flwr 1.41, Message API): FedAcross+ and a generic adapter for any local method + strategy.

Runs in process through ``LocalGrid``, and on Flower's simulation engine (Ray) or a
real deployment (``flower-superlink`` + ``flower-supernode`` + ``flwr run ftta_core/flower/app``) through
``ftta_core.flower.deploy`` (not imported here; see the README's "Deploying a strategy across machines with Flower").
"""
from .engine_app import FlowerRun, engine_client_app, engine_server_app, run_engine_on_flower
from .fedacross_app import FedAcrossRun, fedacross_client_app, fedacross_server_app, run_fedacross_on_flower
from .grid import LocalGrid, run_inprocess

__all__ = ["FlowerRun", "FedAcrossRun", "LocalGrid", "engine_client_app", "engine_server_app", "fedacross_client_app",
           "fedacross_server_app", "run_engine_on_flower", "run_fedacross_on_flower", "run_inprocess"]
