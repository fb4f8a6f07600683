"""ftta on Flower (flwr 1.41, Message API): FedAcross+ and a generic adapter for any local method + strategy.

Runs in process through ``LocalGrid``, and on Flower's simulation engine (Ray) or a
real deployment (``flower-superlink`` + ``flower-supernode`` + ``flwr run ftta_core/flower/app``) through
``ftta_core.flower.deploy`` (see docs/flower.md).
The names below are imported on first use: a ClientApp process (one per message in a deployment) that imports
``ftta_core.flower.deploy`` does not pay for FedAcross+'s torchvision.
"""
from importlib import import_module
from typing import Any

_WHERE = {"FlowerRun": "engine_app", "FlowerServer": "engine_app", "StopRun": "engine_app",
          "engine_client_app": "engine_app", "engine_server_app": "engine_app", "run_engine_on_flower": "engine_app",
          "FedAcrossRun": "fedacross_app", "fedacross_client_app": "fedacross_app",
          "fedacross_server_app": "fedacross_app", "run_fedacross_on_flower": "fedacross_app",
          "LocalGrid": "grid", "run_inprocess": "grid"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
