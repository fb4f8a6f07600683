"""Any ftta local method + strategy on Flower: ClientApps adapt and upload, the ServerApp computes W and mixes.

Per stream step t the ServerApp sends every node a ``train`` message; the node's ClientApp (one client's model copy
as a one-client ``LoopBank`` and its row of the stream from ``ftta_core.experiment.build_stream``) adapts on its
batch and replies with what leaves the client: the local method's ``shared_state`` and the strategy's uploads
(e.g. the FedTSA/FedAMP source-feature 'indicator'). The server stacks the uploads, checks them, computes
``W = strategy.collaboration``, mixes and sends each client its own row of the mixed state in an ``evaluate``
message; the client installs it, predicts and replies with its predictions (for recording only).
Client-side strategy hooks (regularisers, probe uploads, memories) run on a one-client copy of the strategy that
observes the client's own received state.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ..engine.bank import make_bank
from ..engine.mixing import finite_clients, restrict_to_valid
from ..experiment import ExperimentConfig, local_params, strategy_params
from ..rng import derive_seed
from ..stream import Stream
from ..strategies import build_strategy
from ..strategies.base import ServerInputs, check_collaboration
from ..tta import build_local
from .grid import run_inprocess
from .records import from_record, to_record


def _strip(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Drop the leading one-client dimension."""
    return {k: v[0] for k, v in tensors.items()}


def _stack(rows: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Stack per-client tensors into [N, ...]."""
    return {k: torch.stack([r[k] for r in rows]) for k in (rows[0] if rows else {})}


class EngineClient:
    """One client: its model copy (a one-client loop bank), local method, strategy hooks and stream row."""

    def __init__(self, cfg: ExperimentConfig, client: int, stream: Stream) -> None:
        from ..training import load_source_model

        torch.manual_seed(derive_seed(cfg.seed, "engine"))
        self.client, self.stream = client, stream
        self.source = load_source_model(cfg.model_name, device="cpu")
        self.local = build_local(cfg.local, **local_params(cfg))
        self.strategy = build_strategy(cfg.strategy, **strategy_params(cfg))
        self.strategy.reset(1)
        self.bank = make_bank("loop", self.source, 1, self.local.trainable(self.source), self.local.optimizer())
        self.x: Optional[torch.Tensor] = None
        self.state: Dict[str, torch.Tensor] = {}

    def train(self, step: int) -> Dict[str, Dict[str, torch.Tensor]]:
        """Adapt on this client's batch at ``step``; return {'state': shared state, 'uploads': strategy uploads}."""
        batch = self.stream.batch(step)
        x = batch.images[self.client:self.client + 1]
        self.x, self.y = x, batch.labels[self.client]
        with torch.no_grad():
            src_feats = self.source.forward_features(x[0])
        out = self.local.adapt(self.bank, x, self.strategy.regularizer(self.bank, x))
        self.state = self.local.shared_state(self.bank)
        context = {"indicator": src_feats.mean(0, keepdim=True), "feature_mean": out.features.mean(1),
                   "logits_mean": out.logits.mean(1)}
        context.update(self.strategy.probe_uploads(self.bank, self.local, x, step))
        uploads = self.strategy.client_uploads(context)
        return {"state": _strip(self.state), "uploads": _strip(uploads)}

    def receive_and_predict(self, mixed: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Install the server's mixed state for this client, predict on the current batch; returns logits [B, K]."""
        if mixed:
            mixed1 = {k: v[None] for k, v in mixed.items()}
            self.local.load_state(self.bank, mixed1)
            self.strategy.after_mix(mixed1, ServerInputs(0, self.state, {}, torch.ones(1, dtype=torch.bool)))
        if self.strategy.finetune_after_mix and self.local.shares == "params":
            self.local.adapt(self.bank, self.x)
        return self.local.predict(self.bank, self.x).logits[0]


def engine_client_app(cfg: ExperimentConfig, stream: Stream) -> ClientApp:
    """A ClientApp whose node ``node_config['client']`` runs client i of ``cfg`` (state kept per node)."""
    app = ClientApp()
    clients: Dict[int, EngineClient] = {}

    def runtime(context: Context) -> EngineClient:
        i = int(context.node_config["client"])
        if context.node_id not in clients:
            clients[context.node_id] = EngineClient(cfg, i, stream)
        return clients[context.node_id]

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        step = int(msg.content["config"]["step"])
        out = runtime(context).train(step)
        return Message(RecordDict({"state": to_record(out["state"]), "uploads": to_record(out["uploads"]),
                                   "meta": ConfigRecord({"client": int(context.node_config["client"]),
                                                         "n": int(runtime(context).x.shape[1])})}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        rt = runtime(context)
        logits = rt.receive_and_predict(from_record(msg.content["mixed"]))
        return Message(RecordDict({"logits": to_record({"logits": logits}),
                                   "meta": ConfigRecord({"client": rt.client})}), reply_to=msg)

    return app


@dataclass
class FlowerRun:
    """What the server recorded: W per step [T, N, N], logits per step [T, N, B, K], labels [T, N, B]."""

    weights: List[np.ndarray] = field(default_factory=list)
    logits: List[torch.Tensor] = field(default_factory=list)
    labels: List[torch.Tensor] = field(default_factory=list)
    messages: int = 0


def server_step(strategy, replies: List[Message], n: int) -> tuple:
    """Stack the uploads (ordered by client), check them, compute W and the mixed state per client."""
    by_client = sorted(replies, key=lambda m: int(m.content["meta"]["client"]))
    state = _stack([from_record(m.content["state"]) for m in by_client])
    uploads = _stack([from_record(m.content["uploads"]) for m in by_client])
    valid = finite_clients({**state, **uploads}, n)
    sizes = torch.tensor([float(m.content["meta"]["n"]) for m in by_client])
    inputs = ServerInputs(0, state, uploads, valid, sizes)
    weights = check_collaboration(restrict_to_valid(strategy.collaboration(inputs).detach().float().cpu(), valid), n)
    mixed = strategy.mix(state, weights) if state else {}
    if mixed and not bool(valid.all()):
        mixed = {k: torch.where(valid.view(-1, *[1] * (v.dim() - 1)), v, state[k]) for k, v in mixed.items()}
    if state:
        strategy.after_mix(mixed, inputs)
    return weights, mixed


def engine_server_app(cfg: ExperimentConfig, n_steps: int, record: FlowerRun) -> ServerApp:
    """A ServerApp running ``n_steps`` steps of ``cfg``'s strategy over the grid's nodes."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = build_strategy(cfg.strategy, **strategy_params(cfg))
        nodes = sorted(grid.get_node_ids())
        strategy.reset(len(nodes))
        for t in range(n_steps):
            msgs = [grid.create_message(RecordDict({"config": ConfigRecord({"step": t})}), "train", nid, str(t))
                    for nid in nodes]
            replies = list(grid.send_and_receive(msgs))
            weights, mixed = server_step(strategy, replies, len(nodes))
            order = {int(m.content["meta"]["client"]): m.metadata.src_node_id for m in replies}
            msgs = [grid.create_message(RecordDict({"mixed": to_record({k: v[i] for k, v in mixed.items()})}),
                                        "evaluate", order[i], str(t)) for i in range(len(nodes))]
            back = sorted(grid.send_and_receive(msgs), key=lambda m: int(m.content["meta"]["client"]))
            record.weights.append(weights.numpy())
            record.logits.append(torch.stack([from_record(m.content["logits"])["logits"] for m in back]))
            record.messages += 2 * len(nodes)

    return app


def run_engine_on_flower(cfg: ExperimentConfig, n_steps: Optional[int] = None, stream: Optional[Stream] = None
                         ) -> FlowerRun:
    """Run ``cfg`` (any local method and strategy) as a Flower ServerApp + one ClientApp per client, in process."""
    from ..experiment import build_stream

    stream = stream or build_stream(dataclasses.replace(cfg, device="cpu"), "cpu")
    steps = min(len(stream), n_steps or cfg.max_steps or len(stream))
    record = FlowerRun()
    run_inprocess(engine_server_app(cfg, steps, record), engine_client_app(cfg, stream),
                  [{"client": i} for i in range(cfg.clients)])
    record.labels = [stream.batch(t).labels for t in range(steps)]
    return record
