"""The generic engine adapter as a deployable Flower app (``flower-superlink`` + ``flower-supernode`` + ``flwr run``).

The app folder is ``ftta_core/flower/app/`` (its ``pyproject.toml`` names ``server_app`` and ``client_app`` below);
the run configuration (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``) chooses the dataset,
local method, strategy, number of clients and steps and the seed; each SuperNode's ``--node-config 'client=i'``
says which client (stream row / partition) it is.

In a deployment every message is handled by a fresh ``flwr-clientapp`` process, so a client's whole state (its
model copy, the local method's and the strategy's client-side state, the torch RNG) is pickled into the node's
persistent ``context.state`` after each message and restored before the next. The stream is rebuilt from the
run config on the node (each node only reads its own row). Clients evaluate their own predictions and report
per-step correct counts. The ServerApp (``engine_app.FlowerServer``) waits up to ``timeout`` for ``clients``
nodes, runs the steps (one message per client per step: the previous step's mixed row + the next batch's
upload; uploads checked, W, personalised mix) and, when the run config names ``out``, rewrites a JSON record there
after every step and every ``heartbeat`` seconds while it waits (``status``: running / finished / stopped: reason;
``heartbeat``: when, the ServerApp's process id and host, so ``python -m ftta_core runs`` tells a dead server's
record, ``interrupted``, from a live one). A client that does not answer a step within
``timeout`` (or whose SuperNode goes offline) is absent at that step; below ``min-clients`` answers (default 0 =
all ``clients``) the run stops: the record says why and the ServerApp raises, so Flower marks the run failed.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Dict, Mapping

import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ..experiment import ExperimentConfig, build_stream
from .engine_app import HEARTBEAT_S, EngineClient, FlowerServer, client_reply

APP_DIR = Path(__file__).resolve().parent / "app"  # the Flower app folder to pass to ``flwr run``

# run-config keys (TOML-style, dashes) -> ExperimentConfig fields
_FIELDS = {"dataset": "dataset", "scenario": "scenario", "corruptions": "corruptions", "severity": "severity",
           "clients": "clients", "batch-size": "batch_size", "images-per-client": "images_per_client",
           "local": "local", "strategy": "strategy", "model": "model", "seed": "seed", "steps": "max_steps"}
_STATE_KEY = "ftta-client"


def config_from_run_config(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """The ExperimentConfig a run config describes (loop backend, CPU); JSON strings for the method parameters."""
    kwargs: Dict[str, Any] = {f: run_config[k] for k, f in _FIELDS.items() if k in run_config and run_config[k] != ""}
    for key, f in (("local-params", "local_params"), ("strategy-params", "strategy_params")):
        if run_config.get(key):
            kwargs[f] = json.loads(str(run_config[key]))
    return ExperimentConfig(**kwargs, backend="loop", device="cpu")


def run_config_of(cfg: ExperimentConfig, steps: int) -> Dict[str, Any]:
    """The ``flwr run --run-config`` overrides that describe ``cfg`` (inverse of ``config_from_run_config``)."""
    out: Dict[str, Any] = {k: getattr(cfg, f) for k, f in _FIELDS.items() if f != "max_steps"}
    out["model"] = cfg.model or ""
    out["steps"] = int(steps)
    if not isinstance(cfg.corruptions, str):
        out["corruptions"] = ",".join(cfg.corruptions)
    out["local-params"] = json.dumps(cfg.local_params) if cfg.local_params else ""
    out["strategy-params"] = json.dumps(cfg.strategy_params) if cfg.strategy_params else ""
    return out


def _client_id(context: Context) -> int:
    cfg = context.node_config
    key = "client" if "client" in cfg else "partition-id"
    if key not in cfg:
        raise KeyError(f"SuperNode node_config {dict(cfg)} names no client: start it with --node-config 'client=<i>'")
    return int(cfg[key])


def _load_client(context: Context) -> EngineClient:
    """This node's client: restored from ``context.state`` or built fresh (first message of the run)."""
    cfg = config_from_run_config(context.run_config)
    stream = build_stream(cfg, "cpu")
    if _STATE_KEY in context.state:
        blob = context.state[_STATE_KEY]["blob"]
        saved = torch.load(io.BytesIO(blob), weights_only=False)
        client, rng = saved["client"], saved["rng"]
        torch.set_rng_state(rng)
        client.stream = stream
        return client
    i = _client_id(context)
    if not 0 <= i < cfg.clients:
        raise ValueError(f"node_config client={i} outside 0..{cfg.clients - 1}")
    return EngineClient(cfg, i, stream)


def _save_client(context: Context, client: EngineClient) -> None:
    stream, client.stream = client.stream, None
    try:
        buf = io.BytesIO()
        torch.save({"client": client, "rng": torch.get_rng_state()}, buf)
    finally:
        client.stream = stream
    context.state[_STATE_KEY] = ConfigRecord({"blob": buf.getvalue()})


client_app = ClientApp()


def _handle(msg: Message, context: Context) -> Message:
    """One round of the step protocol (``engine_app.client_reply``) with the client restored from and saved to
    the node's ``context.state``."""
    client = _load_client(context)
    reply = client_reply(client, msg)
    _save_client(context, client)
    return reply


client_app.train()(_handle)
client_app.evaluate()(_handle)

server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    cfg = config_from_run_config(rc)
    steps, timeout = int(rc.get("steps", 3)), float(rc.get("timeout", 600))
    min_clients = int(rc.get("min-clients", 0)) or cfg.clients  # 0: all clients
    config = dict(run_config_of(cfg, steps), timeout=timeout, **{"min-clients": min_clients})
    server = FlowerServer(cfg, steps, timeout=timeout, min_clients=min_clients,
                          out=str(rc["out"]) if rc.get("out") else None, run_config=config,
                          heartbeat_s=float(rc.get("heartbeat", HEARTBEAT_S)))
    server.run(grid)  # raises StopRun when too few clients answer: Flower then marks the run failed
