"""An in-process Flower Grid: a ServerApp's messages are delivered to ClientApp objects in this process.

The fast path for tests and notebooks: the ServerApp and ClientApps are the real Flower objects and exchange real
``Message``/``RecordDict`` objects (each ``ArrayRecord`` holds serialised bytes), only the transport is a function
call, with no process per message. The same apps also run on a real superlink/supernodes and on Flower's Ray
simulation engine (``ftta_core/flower/deploy.py``, ``tests/test_flower_deployment.py``). Message ids are assigned
as Flower's own ``InMemoryGrid`` does. As on a SuperNode, a ClientApp that raises answers with an error reply;
``remove_node`` (a killed SuperNode: offline, its messages never answered) and ``add_node`` (a SuperNode that
registers during the run, with a fresh context) let tests inject faults.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


NODE_ID_BASE = 1000  # node ids NODE_ID_BASE + i (the SuperLink itself is node 1 in Flower's runtimes)


class LocalGrid(Grid):
    """Delivers each pushed message to ``client_app`` with the destination node's persistent ``Context``."""

    def __init__(self, client_app: ClientApp, node_configs: List[Dict[str, object]], run_config: Dict[str, object],
                 run_id: int = 1) -> None:
        if not node_configs:
            raise ValueError("node_configs must name at least one node")
        self.client_app = client_app
        self._run: Optional[Run] = None
        self.run_id = run_id
        self.contexts = {NODE_ID_BASE + i: Context(run_id=run_id, node_id=NODE_ID_BASE + i, node_config=dict(cfg), state=RecordDict(),
                                        run_config=dict(run_config)) for i, cfg in enumerate(node_configs)}
        self.run_config = dict(run_config)
        self.offline: set = set()
        self.replies: Dict[str, Message] = {}
        self.messages_sent = 0

    def add_node(self, node_config: Dict[str, object]) -> int:
        """A new node (fresh context, state lost) joins; returns its id."""
        node = NODE_ID_BASE + len(self.contexts)
        self.contexts[node] = Context(run_id=self.run_id, node_id=node, node_config=dict(node_config),
                                      state=RecordDict(), run_config=dict(self.run_config))
        return node

    def remove_node(self, node: int) -> None:
        """Node ``node`` dies: it is offline from now on and its messages are never answered."""
        self.offline.add(node)

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:  # type: ignore[override]
        return self._run  # type: ignore[return-value]

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: Optional[float] = None) -> Message:
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if node not in self.contexts:
                raise ValueError(f"message for unknown node {node}; nodes: {list(self.contexts)}")
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            self.messages_sent += 1
            ids.append(msg.metadata.message_id)
            if node in self.offline:
                continue
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as err:  # noqa: BLE001 -- as a SuperNode does: the ClientApp's error is the reply
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
            self.replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def run_inprocess(server_app: ServerApp, client_app: ClientApp, node_configs: List[Dict[str, object]],
                  run_config: Optional[Dict[str, object]] = None, grid_class: type = LocalGrid) -> Context:
    """Run ``server_app`` against one ClientApp per entry of ``node_configs``; returns the server's Context.
    ``grid_class``: a ``LocalGrid`` subclass (e.g. one that kills a node at some step)."""
    grid = grid_class(client_app, node_configs, run_config or {})
    context = Context(run_id=grid.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=dict(run_config or {}))
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    # the identity Flower's own simulation runtime gives the ServerApp's process (messages read it)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    try:
        server_app(grid, context)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    return context
