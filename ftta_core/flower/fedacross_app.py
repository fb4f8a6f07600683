"""FedAcross+ as a Flower ServerApp + ClientApp (Message API).

Round 1: every initial client receives the server's A (f and g are pre-configured on the device), selects its
support set from its stream (balanced k-shot, random or VeSSAL), trains A (eq. 3), builds prototypes (eq. 4) and
upstreams A and the prototypes. The server merges A by FedAvg (weights: support sizes) and keeps the prototypes.
Round 2: each joining client trains for a few steps starting from the merged A and, for comparison, from the
server's A; both accuracies are recorded (the benefit of the merge).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ..fedacross.client import ClientSpec, accuracy, merge_adapters, predict, run_client
from ..fedacross.model import FedAcrossNet, adapter_state, load_adapter
from ..fedacross.features import ClientFeatures, support_indices
from .grid import run_inprocess
from .records import from_record, record_bytes, to_record


def fedacross_client_app(model: FedAcrossNet, clients: Sequence[ClientFeatures], spec: ClientSpec) -> ClientApp:
    """A ClientApp: node ``node_config['client']`` holds client i's features (f frozen: computed once)."""
    import copy
    import dataclasses

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        c = clients[int(context.node_config["client"])]
        cfg = msg.content["config"]
        start = from_record(msg.content["adapter"])
        local = copy.deepcopy(model)
        load_adapter(local, start)
        idx = support_indices(str(cfg["selection"]), local, c, int(cfg["k"]), int(cfg["seed"]), c.name)
        steps = int(cfg["max_steps"])
        run_spec = dataclasses.replace(spec, max_steps=None if steps < 0 else steps)
        result = run_client(local, c.stream[idx], c.stream_labels[idx], run_spec, None, int(cfg["seed"]), c.name)
        acc = accuracy(predict(local, result, c.test), c.test_labels)
        protos = result.prototypes
        content = RecordDict({
            "adapter": to_record(result.adapter),
            "prototypes": to_record({"centres": protos.centres[protos.present], "classes": torch.nonzero(protos.present).flatten()}),
            "metrics": MetricRecord({"accuracy": acc, "n_support": result.n_support,
                                     "client": int(context.node_config["client"])})})
        return Message(content, reply_to=msg)

    return app


@dataclass
class FedAcrossRun:
    """What the server recorded."""

    accuracy: Dict[str, float] = field(default_factory=dict)
    new_client: List[Dict[str, object]] = field(default_factory=list)
    bytes_down: int = 0
    bytes_up: int = 0
    prototypes: Dict[int, Dict[str, torch.Tensor]] = field(default_factory=dict)
    merged: Optional[Dict[str, torch.Tensor]] = None


def fedacross_server_app(model: FedAcrossNet, n_initial: int, k: int, selection: str, new_client_steps: int,
                         record: FedAcrossRun, seed: int = 0) -> ServerApp:
    """ServerApp: round 1 adapts the first ``n_initial`` nodes; round 2 lets the others join from merged vs server A."""
    app = ServerApp()

    def send(grid: Grid, nodes: List[int], adapter: Dict[str, torch.Tensor], steps: int, group: str):
        cfg = ConfigRecord({"k": k, "selection": selection, "seed": seed, "max_steps": steps})
        msgs = [grid.create_message(RecordDict({"adapter": to_record(adapter), "config": cfg}), "train", n, group)
                for n in nodes]
        record.bytes_down += sum(record_bytes(m.content["adapter"]) for m in msgs)
        replies = list(grid.send_and_receive(msgs))
        record.bytes_up += sum(record_bytes(r.content["adapter"]) + record_bytes(r.content["prototypes"])
                               for r in replies)
        return sorted(replies, key=lambda r: int(r.content["metrics"]["client"]))

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        nodes = sorted(grid.get_node_ids())
        server_a = adapter_state(model)
        replies = send(grid, nodes[:n_initial], server_a, -1, "round-1")
        for r in replies:
            client = int(r.content["metrics"]["client"])
            record.accuracy[f"client {client}"] = float(r.content["metrics"]["accuracy"])
            record.prototypes[client] = from_record(r.content["prototypes"])
        record.merged = merge_adapters([from_record(r.content["adapter"]) for r in replies],
                                       [float(r.content["metrics"]["n_support"]) for r in replies])
        for start, adapter in (("server A", server_a), ("merged A (FedAvg)", record.merged)):
            for r in send(grid, nodes[n_initial:], adapter, new_client_steps, f"join-{start}"):
                record.new_client.append({"client": int(r.content["metrics"]["client"]), "start": start,
                                          "steps": new_client_steps, "accuracy": float(r.content["metrics"]["accuracy"])})

    return app


def run_fedacross_on_flower(model: FedAcrossNet, clients: Sequence[ClientFeatures], k: int, selection: str = "balanced",
                            n_new: int = 1, new_client_steps: int = 5, spec: ClientSpec = ClientSpec(),
                            seed: int = 0) -> FedAcrossRun:
    """FedAcross+ over one Flower node per client (the last ``n_new`` join in round 2), in process."""
    if not 0 < n_new < len(clients):
        raise ValueError(f"n_new must be in [1, {len(clients) - 1}], got {n_new}")
    record = FedAcrossRun()
    run_inprocess(fedacross_server_app(model, len(clients) - n_new, k, selection, new_client_steps, record, seed),
                  fedacross_client_app(model, clients, spec), [{"client": i} for i in range(len(clients))])
    return record
