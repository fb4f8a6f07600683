"""The generic engine adapter as a deployable Flower app (``flower-superlink`` + ``flower-supernode`` + ``flwr run``).

The app folder is ``ftta_core/flower/app/`` (its ``pyproject.toml`` names ``server_app`` and ``client_app`` below);
the run configuration (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``) chooses the dataset,
local method, strategy, number of clients and steps and the seed; each SuperNode's ``--node-config 'client=i'``
says which client (stream row / partition) it is.

In a deployment every message is handled by a fresh ``flwr-clientapp`` process, so a client's whole state (its
model copy, the local method's and the strategy's client-side state, the torch RNG) is pickled into the node's
persistent ``context.state`` after each message and restored before the next. The stream is rebuilt from the
run config on the node (each node only reads its own row). Clients evaluate their own predictions and report
per-step correct counts; the ServerApp waits for ``clients`` nodes, runs the steps (``server_step``: uploads
-> W -> personalised mix) and, when the run config names ``out``, writes a JSON record there.
"""
from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ..experiment import ExperimentConfig, build_stream, strategy_params
from ..strategies import build_strategy
from .engine_app import EngineClient, server_step
from .records import from_record, record_bytes, to_record

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


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    client = _load_client(context)
    out = client.train(int(msg.content["config"]["step"]))
    _save_client(context, client)
    return Message(RecordDict({"state": to_record(out["state"]), "uploads": to_record(out["uploads"]),
                               "meta": ConfigRecord({"client": client.client, "n": int(client.x.shape[1])})}),
                   reply_to=msg)


@client_app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    client = _load_client(context)
    logits = client.receive_and_predict(from_record(msg.content["mixed"]))
    _save_client(context, client)
    correct = int((logits.argmax(-1) == client.y.to(logits.device)).sum())
    return Message(RecordDict({"logits": to_record({"logits": logits}),
                               "meta": ConfigRecord({"client": client.client, "correct": correct})}), reply_to=msg)


def _exchange(grid: Grid, msgs: List[Message], timeout: float, what: str) -> List[Message]:
    """send_and_receive that fails loudly on missing or error replies."""
    replies = list(grid.send_and_receive(msgs, timeout=timeout))
    errors = [f"node {m.metadata.src_node_id}: {m.error.reason}" for m in replies if m.has_error()]
    if errors:
        raise RuntimeError(f"{what}: ClientApp error(s): " + "; ".join(errors))
    if len(replies) != len(msgs):
        raise RuntimeError(f"{what}: {len(replies)} of {len(msgs)} replies within {timeout}s")
    return replies


def _wait_for_nodes(grid: Grid, n: int, timeout: float) -> List[int]:
    start = time.monotonic()
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"only {len(nodes)} of {n} SuperNodes connected after {timeout}s")
        time.sleep(0.5)


server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    cfg = config_from_run_config(rc)
    steps = int(rc.get("steps", 3))
    timeout = float(rc.get("timeout", 600))
    strategy = build_strategy(cfg.strategy, **strategy_params(cfg))
    nodes = _wait_for_nodes(grid, cfg.clients, timeout)
    strategy.reset(cfg.clients)
    record: Dict[str, Any] = {"config": run_config_of(cfg, steps), "nodes": len(nodes), "weights": [], "logits": [],
                              "correct": [], "bytes_up": 0, "bytes_down": 0, "messages": 0}
    clients_seen: Dict[int, int] = {}
    for t in range(steps):
        msgs = [grid.create_message(RecordDict({"config": ConfigRecord({"step": t})}), "train", nid, str(t))
                for nid in nodes]
        replies = _exchange(grid, msgs, timeout, f"step {t} train")
        ids = sorted(int(m.content["meta"]["client"]) for m in replies)
        if ids != list(range(cfg.clients)):
            raise RuntimeError(f"step {t}: the SuperNodes' client ids are {ids}, expected 0..{cfg.clients - 1} "
                               "(one --node-config 'client=<i>' per SuperNode)")
        record["bytes_up"] += sum(record_bytes(m.content["state"]) + record_bytes(m.content["uploads"])
                                  for m in replies)
        weights, mixed = server_step(strategy, replies, cfg.clients)
        clients_seen = {int(m.content["meta"]["client"]): m.metadata.src_node_id for m in replies}
        down = [to_record({k: v[i] for k, v in mixed.items()}) for i in range(cfg.clients)]
        record["bytes_down"] += sum(record_bytes(r) for r in down)
        msgs = [grid.create_message(RecordDict({"mixed": down[i]}), "evaluate", clients_seen[i], str(t))
                for i in range(cfg.clients)]
        back = sorted(_exchange(grid, msgs, timeout, f"step {t} evaluate"),
                      key=lambda m: int(m.content["meta"]["client"]))
        record["weights"].append(weights.tolist())
        record["logits"].append([from_record(m.content["logits"])["logits"].tolist() for m in back])
        record["correct"].append([int(m.content["meta"]["correct"]) for m in back])
        record["messages"] += 2 * cfg.clients
    if rc.get("out"):
        out = Path(str(rc["out"]))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(out)  # atomic: a reader sees the whole record or none
