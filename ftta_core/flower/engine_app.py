"""Any ftta local method + strategy on Flower: ClientApps adapt and upload, the ServerApp computes W and mixes.

Protocol: one message per client per step. Round r (r = 0..T) sends each client a message that (a) carries its
personalised row of the mixed state of step r-1, on which it predicts (its batch of step r-1) and reports its
correct count, then (b) asks it to adapt on its batch of step r and upload what leaves the client: the local
method's ``shared_state`` and the strategy's uploads (e.g. the FedTSA/FedAMP source-feature 'indicator'). Round 0
has no (a), round T (an ``evaluate`` message) no (b). The client does exactly what ``Engine.step`` does for it, in
the same order (receive the mix, predict, adapt on the next batch), at one round trip per step instead of two.

The server (``FlowerServer``) checks every upload with the engine's ``UploadGate`` (``engine.uploads``: shape,
dtype, missing or unexpected names, NaN/Inf, BN variances, magnitude), computes ``W = strategy.collaboration`` over
the accepted clients, mixes (``server_step``: the server half of ``Engine.server_phase``, same calls in the same
order) and sends each client its row. Faults are handled per step:

* a client whose reply does not come (no reply within ``timeout``; its SuperNode went offline -- Flower marks a
  SuperNode offline when it misses its heartbeats; a ClientApp error) is **absent** at that step, as with partial
  participation in the engine: no weight in W, it keeps its own model, its prediction of the step is not reported.
  The run goes on while at least ``min_clients`` clients answered; below that it **stops** (``StopRun``);
* a client whose upload fails the checks is **rejected**: no weight in W, no mixed row back (it keeps its own
  model), it still predicts and reports; the reason is logged and recorded;
* a SuperNode that registers during the run (e.g. a restarted one: Flower gives it a new node id) gets the next
  step's message; its reply names its client (``--node-config client=i``), and it takes that client's slot if the
  slot's node did not answer in that round (the old node is then never contacted again). Its ``context.state``
  was lost with the old process, so it starts again from the source model, adapts on the current batch, and from
  the mix on receives its personalised row like every other client (optimiser and client-side strategy state
  start afresh).

The record (``FlowerServer.record``, JSON at ``out``, rewritten atomically after every round and every
``heartbeat_s`` seconds while the server waits) holds per finished step W, logits, correct counts (``null`` where
not reported), absent and rejected clients with reasons, a ``status``: ``running``, ``finished`` or ``stopped:
<reason>``, and a ``heartbeat`` (``runstore.heartbeat``: when it was last written, the server's process id, host and
process start time): ``python -m ftta_core runs`` reports a ``running`` record whose server is gone (or has not
written for ``runstore.HEARTBEAT_STALE`` intervals, e.g. hung on a dead SuperLink) as ``interrupted``. A client that
uploaded at a step but died before its prediction of that step came back is **absent** at that step too (its upload
counted in W; the reason says so). A server started again with the same ``out`` cannot resume (docs/flower.md says
why): it refuses while the former record's server is alive, else starts from step 0 and notes the record it
replaced as an event. Client-side strategy hooks (regularisers, probe
uploads, memories) run on a one-client copy of the strategy that observes the client's own received state.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ..build import build_local_for, build_strategy_for
from ..engine.bank import make_bank
from ..loop import ServerRound, participants, server_round
from ..engine.uploads import UploadGate, UploadPolicy, by_name, describe_rejections, reference_values
from ..experiment import ExperimentConfig
from ..rng import derive_seed
from ..stream import Stream
from ..strategies.base import ServerInputs, client_regularizer, probe_uploads
from .grid import run_inprocess
from .records import from_record, record_bytes, to_record

log = logging.getLogger("flwr")  # Flower's logger: its lines reach the SuperLink's log / `flwr log`

POLL_S = 0.5  # how often the server pulls replies (Flower's own send_and_receive sleeps 3 s)
HEARTBEAT_S = 30.0  # how often the server rewrites its record while waiting (``runstore.heartbeat``)


def _strip(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Drop the leading one-client dimension."""
    return {k: v[0] for k, v in tensors.items()}


class EngineClient:
    """One client: its model copy (a one-client loop bank), local method, strategy hooks and stream row."""

    def __init__(self, cfg: ExperimentConfig, client: int, stream: Stream) -> None:
        from ..training import load_source_model

        torch.manual_seed(derive_seed(cfg.seed, "engine"))
        self.client, self.stream = client, stream
        self.source = load_source_model(cfg.model_name, device="cpu")
        self.local = build_local_for(cfg)
        self.strategy = build_strategy_for(cfg)  # its client hooks run on this one client (``ClientHooks``)
        self.strategy.reset(1)
        self.bank = make_bank("loop", self.source, 1, self.local.trainable(self.source), self.local.optimizer())
        self.x: Optional[torch.Tensor] = None
        self.step: Optional[int] = None  # the step of the batch in ``x``
        self.state: Dict[str, torch.Tensor] = {}

    def train(self, step: int) -> Dict[str, Dict[str, torch.Tensor]]:
        """Adapt on this client's batch at ``step``; return {'state': shared state, 'uploads': strategy uploads}."""
        batch = self.stream.batch(step)
        x = batch.images[self.client:self.client + 1]
        self.x, self.y, self.step = x, batch.labels[self.client], step
        with torch.no_grad():
            src_feats = self.source.forward_features(x[0])
        out = self.local.adapt(self.bank, x, client_regularizer(self.strategy, self.bank, x))
        self.state = self.local.shared_state(self.bank)
        context = {"indicator": src_feats.mean(0, keepdim=True), "feature_mean": out.features.mean(1),
                   "logits_mean": out.logits.mean(1)}
        context.update(probe_uploads(self.strategy, self.bank, self.local, x, step))
        uploads = self.strategy.client_uploads(context)
        return {"state": _strip(self.state), "uploads": _strip(uploads)}

    def receive_and_predict(self, mixed: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Install the server's mixed state for this client (empty: its own shared state, as the engine installs a
        rejected client's own row), predict on the current batch; returns logits [B, K]."""
        mixed1 = {k: v[None] for k, v in mixed.items()} if mixed else dict(self.state)
        if mixed1:
            self.local.load_state(self.bank, mixed1)
            self.strategy.after_mix(mixed1, ServerInputs(0, self.state, {}, torch.ones(1, dtype=torch.bool)))
        if self.strategy.finetune_after_mix and self.local.shares == "params":
            self.local.adapt(self.bank, self.x)
        return self.local.predict(self.bank, self.x).logits[0]


# ---------------------------------------------------------------------------------------------------------------
# the step protocol

def step_request(grid: Grid, node: int, train: int, predict: int, mixed: Optional[Dict[str, torch.Tensor]],
                 group: str) -> Message:
    """The server's message of one round: predict step ``predict`` (-1: nothing to predict) with ``mixed`` (this
    client's row; {}: keep its own state), then adapt on step ``train`` and upload (-1: no training)."""
    content = RecordDict({"config": ConfigRecord({"train": int(train), "predict": int(predict)})})
    if predict >= 0:
        content["mixed"] = to_record(mixed or {})
    return grid.create_message(content, "train" if train >= 0 else "evaluate", node, group)


def client_reply(client: EngineClient, msg: Message) -> Message:
    """The client's side of one round (``step_request``): predict (when asked), then adapt and upload (when asked).
    The reply's ``meta`` names the client, the step predicted (-1: none) and trained (-1: none)."""
    cfg = msg.content["config"]
    train, predict = int(cfg.get("train", -1)), int(cfg.get("predict", -1))
    content: Dict[str, Any] = {}
    meta: Dict[str, Any] = {"client": int(client.client), "predicted": -1, "trained": -1}
    if predict >= 0 and client.step == predict and client.x is not None:  # (a restarted node has nothing to predict)
        mixed = from_record(msg.content["mixed"]) if "mixed" in msg.content else {}
        logits = client.receive_and_predict(mixed)
        meta.update(predicted=predict, correct=int((logits.argmax(-1) == client.y.to(logits.device)).sum()))
        content["logits"] = to_record({"logits": logits})
    if train >= 0:
        out = client.train(train)
        content["state"], content["uploads"] = to_record(out["state"]), to_record(out["uploads"])
        meta.update(trained=train, n=int(client.x.shape[1]))
    content["meta"] = ConfigRecord(meta)
    return Message(RecordDict(content), reply_to=msg)


# ---------------------------------------------------------------------------------------------------------------
# the server

def server_step(strategy, gate: UploadGate, step: int, states: List[Optional[Mapping[str, torch.Tensor]]],
                uploads: List[Optional[Mapping[str, torch.Tensor]]], present: torch.Tensor,
                sizes: torch.Tensor) -> ServerRound:
    """The server half of ``Engine.server_phase`` (``loop.server_round``, the same function) on per-client
    uploads (None: the client is absent): check them (``gate``), compute W over the accepted clients, mix; a
    rejected or absent client keeps its own state. One client's upload never raises here: what fails a check is
    rejected."""
    return server_round(strategy, gate, step, by_name(states), by_name(uploads), present, sizes, len(states))


def expected_names(sent: List[Optional[Mapping[str, torch.Tensor]]], known: Set[str]) -> Set[str]:
    """The upload names a step accepts: those a strict majority of the answering clients sent, and those already
    learned (``known``) that anyone sent. Honest clients run the same code and send the same names; a name sent by
    a minority only is unexpected (its senders are rejected), a learned name missing from a client rejects it."""
    rows = [s for s in sent if s is not None]
    counts: Dict[str, int] = {}
    for s in rows:
        for k in s:
            counts[k] = counts.get(k, 0) + 1
    return {k for k, c in counts.items() if 2 * c > len(rows) or k in known}


class StopRun(RuntimeError):
    """The server stopped the run before its last step (fewer than ``min_clients`` clients answered); the record
    keeps every finished step and its status says why. Raised from the ServerApp, so Flower marks the run failed."""


@dataclass
class _Pending:
    """A step whose W is computed and whose predictions come in the next round."""

    step: int
    weights: torch.Tensor
    absent: List[bool]
    rejected: List[bool]
    reasons: Dict[int, str]
    rows: Dict[int, Dict[str, torch.Tensor]] = field(default_factory=dict)  # slot -> mixed row ({}: keep own)
    node: Dict[int, int] = field(default_factory=dict)  # slot -> the node that uploaded (it predicts)


class FlowerServer:
    """The ServerApp's loop over the steps, fault-tolerant (module docstring); ``record`` is the JSON record.

    ``timeout``: seconds to wait for the SuperNodes at the start and for each round's replies; ``min_clients``:
    the fewest clients that must answer a step for the run to go on (default: all ``cfg.clients``); ``out``: where
    the record is written after every round (atomically), or None."""

    def __init__(self, cfg: ExperimentConfig, steps: int, *, timeout: float = 600.0,
                 min_clients: Optional[int] = None, out: Optional[str] = None,
                 run_config: Optional[Dict[str, Any]] = None, policy: Optional[UploadPolicy] = None,
                 poll: float = POLL_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        from ..training import load_source_model

        self.cfg, self.steps, self.timeout, self.out, self.poll = cfg, int(steps), float(timeout), out, poll
        if cfg.attack != "none":  # simulated in the engine only; here clients would have to lie themselves
            raise ValueError(f"config field 'attack': {cfg.attack!r} is simulated by the engine (python -m ftta_core "
                             "run); a Flower run has no simulated attackers")
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat must be > 0 seconds, got {heartbeat_s}")
        self.heartbeat_s, self._written_at = float(heartbeat_s), time.monotonic()
        self.n = cfg.clients
        self.min_clients = self.n if not min_clients else int(min_clients)
        if not 1 <= self.min_clients <= self.n:
            raise ValueError(f"min-clients must be in 1..{self.n} (clients), got {min_clients}")
        self.strategy = build_strategy_for(cfg)  # as ``build_run`` builds it for the engine
        self.strategy.reset(self.n)
        self.gate = UploadGate(policy, reference_values(load_source_model(cfg.model_name, device="cpu").eval()))
        self.slot_of: Dict[int, int] = {}  # node id -> client
        self.node_of: Dict[int, int] = {}  # client -> node id
        self.ignored: Set[int] = set()     # nodes never contacted again (replaced, invalid or duplicate client)
        self.record: Dict[str, Any] = {
            "config": dict(run_config or {}), "status": "running", "clients": self.n,
            "min_clients": self.min_clients, "timeout": self.timeout, "nodes": 0, "steps_done": 0,
            "weights": [], "logits": [], "correct": [], "absent": [], "rejected": [], "reasons": [], "events": [],
            "bytes_up": 0, "bytes_down": 0, "messages": 0}

    # -- record
    def _write(self) -> None:
        """Rewrite the record at ``out`` (atomically) with a fresh heartbeat."""
        if self.out:
            from ..runstore import atomic_write_text, heartbeat

            self.record["heartbeat"] = heartbeat(self.heartbeat_s)
            atomic_write_text(self.out, json.dumps(self.record))
            self._written_at = time.monotonic()

    def _beat(self) -> None:
        """While waiting: rewrite the record when ``heartbeat_s`` has passed since it was last written."""
        if self.out and time.monotonic() - self._written_at >= self.heartbeat_s:
            self._write()

    def _replace_former(self) -> None:
        """Before the first write: refuse to replace a record whose server is still alive (``StopRun``, nothing
        written); note a former record (interrupted, stopped, finished) that this run replaces as an event."""
        from ..runstore import heartbeat_status

        try:
            former = json.loads(Path(self.out).read_text()) if self.out else None
        except (OSError, ValueError):
            return
        if not isinstance(former, dict):
            return
        beat = former.get("heartbeat")
        if former.get("status") == "running" and beat is not None and heartbeat_status(beat) == "running":
            raise StopRun(f"{self.out} is the record of a run whose ServerApp is alive (pid {beat.get('pid')} on "
                          f"{beat.get('host')}); give this run another out")
        status = former.get("status")
        if status == "running":
            status = "interrupted"
        self._event(0, "replaced a former record", status=status, steps_done=former.get("steps_done"),
                    last_written=(beat or {}).get("utc"))

    def _event(self, step: int, what: str, **details: Any) -> None:
        self.record["events"].append({"step": step, "event": what, **details})
        log.warning("ftta: step %d: %s %s", step, what, details)

    def run(self, grid: Grid) -> Dict[str, Any]:
        """Run every step on ``grid``; returns the record. Raises ``StopRun`` when too few clients answer (after
        recording it); any other error is recorded as ``stopped: error: ...`` and raised. A record at ``out`` whose
        server is alive is never replaced (``StopRun``)."""
        self._replace_former()
        try:
            self._run(grid)
        except StopRun as stop:
            self.record["status"] = f"stopped: {stop}"
            self._write()
            log.error("ftta: run stopped: %s (record: %s)", stop, self.out or "not written")
            raise
        except BaseException as err:
            self.record["status"] = f"stopped: error: {type(err).__name__}: {err}"
            self._write()
            raise
        self.record["status"] = "finished"
        self._write()
        return self.record

    # -- network
    def _wait_for_nodes(self, grid: Grid) -> List[int]:
        start = time.monotonic()
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= self.n:
                return nodes
            if time.monotonic() - start > self.timeout:
                if len(nodes) >= self.min_clients:
                    self._event(0, "started short", nodes=len(nodes), waited_s=self.timeout)
                    return nodes
                raise StopRun(f"only {len(nodes)} of {self.n} SuperNodes connected within {self.timeout:g}s "
                              f"(min-clients {self.min_clients})")
            self._beat()
            time.sleep(self.poll)

    def _exchange(self, grid: Grid, msgs: List[Message]) -> Tuple[Dict[int, Message], Dict[int, str]]:
        """Push ``msgs``, pull replies until each is in, its node is offline, or ``timeout``; returns (replies by
        node, reasons by node without a reply). Error replies (ClientApp errors, Flower's 'node unavailable') are
        replies."""
        if not msgs:
            return {}, {}
        nodes = [m.metadata.dst_node_id for m in msgs]
        ids = list(grid.push_messages(msgs))
        self.record["messages"] += len(msgs)
        waiting = {i: node for i, node in zip(ids, nodes) if i}
        failed = {node: "the SuperLink refused the message" for i, node in zip(ids, nodes) if not i}
        replies: Dict[int, Message] = {}
        deadline = time.monotonic() + self.timeout
        while waiting:
            for reply in grid.pull_messages(list(waiting)):
                node = waiting.pop(reply.metadata.reply_to_message_id, None)
                if node is not None:
                    replies[node] = reply
            if not waiting:
                break
            online = set(grid.get_node_ids())
            for i, node in list(waiting.items()):
                if node not in online:
                    failed[node] = "its SuperNode went offline"
                    del waiting[i]
            if waiting and time.monotonic() > deadline:
                for node in waiting.values():
                    failed[node] = f"no reply within {self.timeout:g}s"
                break
            if waiting:
                self._beat()
                time.sleep(self.poll)
        return replies, failed

    # -- the steps
    def _run(self, grid: Grid) -> None:
        self.record["nodes"] = len(self._wait_for_nodes(grid))
        self._write()
        pending: Optional[_Pending] = None
        for r in range(self.steps + 1):
            train = r if r < self.steps else -1
            msgs = []
            for node in sorted(grid.get_node_ids()):
                if node in self.ignored:
                    continue
                slot = self.slot_of.get(node)
                predict = pending is not None and slot is not None and pending.node.get(slot) == node
                if train < 0 and not predict:
                    continue
                row = pending.rows[slot] if predict else None
                msgs.append(step_request(grid, node, train, pending.step if predict else -1, row, str(r)))
                if row:
                    self.record["bytes_down"] += record_bytes(msgs[-1].content["mixed"])
            replies, failed = self._exchange(grid, msgs)
            answered, absent_why = self._sort_replies(r, replies, failed)
            if pending is not None:
                self._finish_step(pending, replies, failed)
            if train < 0:
                break
            if len(answered) < self.min_clients:
                why = "; ".join(f"client {i}: {w}" for i, w in sorted(absent_why.items()))
                raise StopRun(f"step {r}: {len(answered)} of {self.n} clients answered, min-clients is "
                              f"{self.min_clients}" + (f" ({why})" if why else ""))
            pending = self._server_step(r, answered, absent_why)
            self._write()

    def _sort_replies(self, r: int, replies: Dict[int, Message], failed: Dict[int, str]
                      ) -> Tuple[Dict[int, Message], Dict[int, str]]:
        """Map replies to clients (new nodes claim theirs); returns (reply per answering client, why per client
        that did not answer)."""
        ok = {node: m for node, m in replies.items() if not m.has_error()}
        answered: Dict[int, Message] = {}
        why: Dict[int, str] = {}
        for node, msg in sorted(replies.items()):
            slot = self.slot_of.get(node)
            claim = _claimed_client(msg)
            if slot is None:  # a node's first reply: it says which client it is
                if msg.has_error():  # tried again next step (the error may pass)
                    self._event(r, "node failed", node=node, reason=_error_reason(msg))
                    continue
                if claim is None or not 0 <= claim < self.n:
                    self.ignored.add(node)
                    self._event(r, "node ignored", node=node, reason=f"claims client {claim}")
                    continue
                holder = self.node_of.get(claim)
                if holder is not None and holder in ok:
                    self.ignored.add(node)
                    self._event(r, "node ignored", node=node, reason=f"client {claim} is node {holder}")
                    continue
                if holder is not None:
                    self.ignored.add(holder)
                    del self.slot_of[holder]
                    self._event(r, "client rejoined", client=claim, node=node, old_node=holder,
                                state="restarted from the source model")
                elif r > 0:
                    self._event(r, "client joined", client=claim, node=node)
                self.slot_of[node], self.node_of[claim] = claim, node
                slot = claim
            if msg.has_error():
                why[slot] = _error_reason(msg)
            elif claim != slot:
                why[slot] = f"its reply claims client {claim}"
            elif _meta_int(msg, "trained") == r:
                answered[slot] = msg
            else:
                why[slot] = "its reply has no upload for this step"
        for node, reason in failed.items():
            slot = self.slot_of.get(node)
            if slot is not None and self.node_of.get(slot) == node:
                why.setdefault(slot, reason)
        for slot in range(self.n):
            if slot not in answered and slot not in why:
                why[slot] = ("no SuperNode has answered for it" if slot not in self.node_of
                             else "its SuperNode is offline")
        return answered, {i: w for i, w in why.items() if i not in answered}

    def _server_step(self, r: int, answered: Dict[int, Message], absent_why: Dict[int, str]) -> _Pending:
        n = self.n
        states: List[Optional[Dict[str, torch.Tensor]]] = [None] * n
        uploads: List[Optional[Dict[str, torch.Tensor]]] = [None] * n
        present = torch.zeros(n, dtype=torch.bool)
        sizes = torch.full((n,), float(self.cfg.batch_size))
        malformed: Dict[int, str] = {}
        # partial participation, drawn as the engine draws it: an answering client not drawn at this step adapted
        # and predicts, but its upload is left out (absent: no weight in W, it keeps its own model)
        drawn = participants(n, self.cfg.participation, self.cfg.seed, r)
        for slot in answered:
            if not bool(drawn[slot]):
                absent_why[slot] = f"not drawn at this step (participation {self.cfg.participation:g})"
        for slot, msg in answered.items():
            if not bool(drawn[slot]):
                continue
            present[slot] = True
            try:
                size = msg.content["meta"]["n"]
                if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= self.cfg.batch_size:
                    raise ValueError(f"it reports {size!r} samples, the batch size is {self.cfg.batch_size}")
                self.record["bytes_up"] += record_bytes(msg.content["state"]) + record_bytes(msg.content["uploads"])
                st, up = from_record(msg.content["state"]), from_record(msg.content["uploads"])
            except Exception as err:  # noqa: BLE001 -- one client's message never stops the server
                malformed[slot] = f"malformed reply: {type(err).__name__}: {err}"
                continue
            states[slot], uploads[slot], sizes[slot] = st, up, float(size)
        for rows in (states, uploads):
            names = expected_names(rows, set(self.gate.schema.expected))
            for slot, row in enumerate(rows):
                if row is not None and set(row) - names:
                    malformed.setdefault(slot, f"unexpected upload {sorted(set(row) - names)[0]!r}")
        # a malformed reply is rejected before the checks: it gets no weight in W and keeps its own model
        checked = present.clone()
        for slot in malformed:
            checked[slot] = False
            states[slot] = uploads[slot] = None
        result = server_step(self.strategy, self.gate, r, states, uploads, checked, sizes)
        valid, reasons = result.valid, {**result.reasons, **malformed}
        if reasons:
            log.warning("ftta: step %d: rejected uploads of %s", r, describe_rejections(reasons))
        pending = _Pending(r, result.weights, [i not in answered or not bool(drawn[i]) for i in range(n)],
                           [bool(present[i] and not valid[i]) for i in range(n)],
                           {**absent_why, **reasons})
        for slot in answered:
            pending.node[slot] = self.node_of[slot]
            pending.rows[slot] = {k: v[slot] for k, v in result.mixed.items()} if bool(valid[slot]) else {}
        return pending

    def _finish_step(self, p: _Pending, replies: Dict[int, Message], failed: Mapping[int, str]) -> None:
        """Record step ``p.step`` with the predictions that came back in this round. A client that uploaded at
        that step but whose prediction did not come (its node died mid-step, or its reply has none) is absent at
        that step: its upload counted in W, the reason says so."""
        logits: List[Optional[list]] = [None] * self.n
        correct: List[Optional[int]] = [None] * self.n
        for slot, node in p.node.items():
            msg = replies.get(node)
            try:
                if msg is None or msg.has_error():
                    raise ValueError(failed.get(node) or (_error_reason(msg) if msg is not None else "no reply"))
                if _meta_int(msg, "predicted") != p.step:
                    raise ValueError("its reply has no prediction for this step")
                value = _meta_int(msg, "correct")
                if value is None:
                    raise ValueError("no correct count")
                logits[slot] = from_record(msg.content["logits"])["logits"].tolist()
                correct[slot] = value
            except Exception as err:  # noqa: BLE001
                p.absent[slot] = True
                p.reasons[slot] = f"its prediction never came ({err}); its upload at this step counted in W"
                log.warning("ftta: step %d: client %d is absent: %s", p.step, slot, p.reasons[slot])
        rec = self.record
        rec["weights"].append(p.weights.tolist())
        rec["logits"].append(logits)
        rec["correct"].append(correct)
        rec["absent"].append(p.absent)
        rec["rejected"].append(p.rejected)
        rec["reasons"].append({str(i): w for i, w in sorted(p.reasons.items())})
        rec["steps_done"] = p.step + 1


def _error_reason(msg: Message) -> str:
    """Why an error reply came back, in words."""
    from flwr.common.constant import ErrorCode

    code, reason = msg.error.code, msg.error.reason
    if code == ErrorCode.NODE_UNAVAILABLE:
        return "its SuperNode went offline (missed heartbeats)"
    if code in (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE):
        return f"its message expired ({reason})"
    return f"ClientApp error: {reason}"


def _meta_int(msg: Message, key: str) -> Optional[int]:
    """An integer of a reply's ``meta`` record, or None."""
    try:
        value = msg.content["meta"][key]
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    except Exception:  # noqa: BLE001
        return None


def _claimed_client(msg: Message) -> Optional[int]:
    """The client a reply says it is, or None (an error reply, or no readable claim)."""
    return None if msg.has_error() else _meta_int(msg, "client")


# ---------------------------------------------------------------------------------------------------------------
# in-process apps

def engine_client_app(cfg: ExperimentConfig, stream: Stream) -> ClientApp:
    """A ClientApp whose node ``node_config['client']`` runs client i of ``cfg`` (state kept per node)."""
    app = ClientApp()
    clients: Dict[int, EngineClient] = {}

    def handle(msg: Message, context: Context) -> Message:
        if context.node_id not in clients:
            clients[context.node_id] = EngineClient(cfg, int(context.node_config["client"]), stream)
        return client_reply(clients[context.node_id], msg)

    app.train()(handle)
    app.evaluate()(handle)
    return app


@dataclass
class FlowerRun:
    """What the server recorded: W per step [T, N, N], logits per step [T, N, B, K] (NaN where a client did not
    report), labels [T, N, B], and the JSON record (``FlowerServer.record``)."""

    weights: List[np.ndarray] = field(default_factory=list)
    logits: List[torch.Tensor] = field(default_factory=list)
    labels: List[torch.Tensor] = field(default_factory=list)
    messages: int = 0
    record: Dict[str, Any] = field(default_factory=dict)


def engine_server_app(cfg: ExperimentConfig, n_steps: int, record: FlowerRun, *, timeout: float = 600.0,
                      min_clients: Optional[int] = None, out: Optional[str] = None,
                      heartbeat_s: float = HEARTBEAT_S) -> ServerApp:
    """A ServerApp running ``n_steps`` steps of ``cfg``'s strategy over the grid's nodes (``FlowerServer``; with
    ``out``, its record is written there as a deployed ServerApp writes it)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        server = FlowerServer(cfg, n_steps, timeout=timeout, min_clients=min_clients, out=out,
                              heartbeat_s=heartbeat_s)
        try:
            server.run(grid)
        finally:
            rec = server.record
            record.record, record.messages = rec, rec["messages"]
            record.weights = [np.asarray(w, dtype=np.float32) for w in rec["weights"]]
            shape = next((torch.tensor(v).shape for step in rec["logits"] for v in step if v is not None), None)
            record.logits = [torch.stack([torch.tensor(v) if v is not None else torch.full(shape, float("nan"))
                                          for v in step]) for step in rec["logits"]]

    return app


def run_engine_on_flower(cfg: ExperimentConfig, n_steps: Optional[int] = None, stream: Optional[Stream] = None,
                         out: Optional[str] = None) -> FlowerRun:
    """Run ``cfg`` (any local method and strategy) as a Flower ServerApp + one ClientApp per client, in process
    (``out``: where the server writes its record, as in a deployment)."""
    from ..build import build_stream

    stream = stream or build_stream(dataclasses.replace(cfg, device="cpu"), "cpu")
    steps = min(len(stream), n_steps or cfg.max_steps or len(stream))
    record = FlowerRun()
    run_inprocess(engine_server_app(cfg, steps, record, out=out), engine_client_app(cfg, stream),
                  [{"client": i} for i in range(cfg.clients)])
    record.labels = [stream.batch(t).labels for t in range(steps)]
    return record
