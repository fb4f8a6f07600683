"""Faults on Flower: nothing lost, nothing silently wrong.

Real deployments over 127.0.0.1 (``ftta_core.flower.loopback``: a SuperLink, one SuperNode per client, ``flwr
run``; every process group stopped in ``finally``):
* a SuperNode SIGKILLed mid-run with ``min-clients`` met: the run goes on without it and finishes; the record has
  every step, the dead client absent from the kill on, the steps before equal to an uninterrupted run and the
  steps after equal to the engine with that client absent (partial participation);
* a SuperNode SIGKILLed with ``min-clients`` not met: the run stops, the record (written after every step) keeps
  the finished steps and says why, and Flower marks the run failed.
The SuperNodes send heartbeats every ~10 s (``Loopback.start_supernode(heartbeat=10)``; Flower's default is 30 s), so
the SuperLink marks a killed one offline after ~20 s instead of ~60 s.

With ``FTTA_SLOW_FLOWER_TESTS=1`` also: a SuperNode killed and started again takes its client's slot back.

In process (``LocalGrid``, fast): one client's malformed upload (wrong shape, wrong dtype, missing or unexpected
name, x1e30, NaN, a false sample count) is rejected -- no crash, the others get exactly what they would get
without that client -- a ClientApp that raises is absent; a node that dies stops the run below ``min-clients``; a
node that restarts (new node id, state lost) takes its client's slot again.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict

import numpy as np
import pytest
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from ftta_core.experiment import ExperimentConfig, build_stream
from ftta_core.flower import FlowerRun, LocalGrid, StopRun, engine_client_app, engine_server_app, run_inprocess
from ftta_core.flower.deploy import run_config_of
from ftta_core.flower.loopback import Loopback, read_record
from ftta_core.flower.records import from_record, to_record
from test_flower_deployment import engine_reference, needs_cli, wait_for_end

TOLERANCE = 1e-5
RUN_TIMEOUT = 300.0  # per step: a killed SuperNode is noticed through its missed heartbeats well before
HEARTBEAT = 10.0     # seconds between a SuperNode's heartbeats (Flower's minimum)


def _cfg(clients: int, steps: int) -> ExperimentConfig:
    return ExperimentConfig(dataset="embedded_digits", clients=clients, local="bn", strategy="fedavg",
                            backend="loop", device="cpu", max_steps=steps, seed=0)


def _as_array(rows, fill=-1) -> np.ndarray:
    return np.array([[fill if v is None else v for v in row] for row in rows])


def _kill_after(tmp_path, clients: int, steps: int, kill: int, after: int, min_clients: int) -> dict:
    """Deploy ``clients`` SuperNodes, SIGKILL client ``kill``'s once ``after`` steps are recorded; the record."""
    cfg, out = _cfg(clients, steps), tmp_path / "result.json"
    t0 = time.monotonic()
    with Loopback(tmp_path) as net:
        net.start_superlink()
        for i in range(clients):
            net.start_supernode(f"supernode{i}", i, heartbeat=HEARTBEAT)
        net.wait_registered(clients)
        run_id = net.submit(dict(run_config_of(cfg, steps), timeout=RUN_TIMEOUT, out=str(out),
                                 **{"min-clients": min_clients}))

        def recorded() -> bool:
            record = read_record(out)
            if record is not None and record["status"] != "running":
                raise AssertionError(f"the run ended before the kill: {record['status']}\n{net.report()}")
            return record is not None and record["steps_done"] >= after

        net.wait(f"{after} steps recorded", recorded, RUN_TIMEOUT, interval=0.2)
        killed_at = read_record(out)["steps_done"]
        net.kill(f"supernode{kill}")
        record = wait_for_end(net, out, run_id, 2 * RUN_TIMEOUT, expect_dead=(f"supernode{kill}",))
    assert not net.alive(), f"still running after stop: {net.alive()}"
    record["killed_at"] = killed_at
    print(f"{clients} SuperNodes, client {kill} killed after {killed_at} steps: {record['status']} "
          f"in {time.monotonic() - t0:.0f}s")
    return record


def _first_absent(record: dict, client: int) -> int:
    return next(t for t, row in enumerate(record["absent"]) if row[client])


@needs_cli
def test_killed_supernode_run_continues_with_min_clients(tmp_path):
    clients, steps, kill = 3, 3, 2
    record = _kill_after(tmp_path, clients, steps, kill, after=1, min_clients=2)
    assert record["status"] == "finished", record["status"]
    assert record["flower_status"].get("status") == "finished:completed", record["flower_status"]
    assert record["steps_done"] == steps and len(record["correct"]) == steps
    died = _first_absent(record, kill)  # the step it died in: its upload counted in W, its prediction never came
    s = died + 1  # the first step the dead client did not upload
    assert record["killed_at"] <= s < steps, (record["killed_at"], s)
    assert "its prediction never came" in record["reasons"][died][str(kill)], record["reasons"]
    absent = np.array(record["absent"])
    assert absent[died:, kill].all() and not absent[:died].any() and not absent[:, :kill].any()
    assert all(record["correct"][t][kill] is None for t in range(s - 1, steps))  # no prediction after the kill
    assert not np.array(record["rejected"]).any()
    assert all("offline" in record["reasons"][t][str(kill)] for t in range(s, steps)), record["reasons"]
    cfg = _cfg(clients, steps)
    stream = build_stream(cfg, "cpu")
    w_ref, correct_ref, logits_ref = engine_reference(cfg, stream, steps)  # uninterrupted
    w_abs, correct_abs, logits_abs = engine_reference(cfg, stream, steps, absent_from={kill: s})
    np.testing.assert_array_equal(w_abs[:s], w_ref[:s])
    weights, correct = np.array(record["weights"]), _as_array(record["correct"])
    # before the kill: the uninterrupted run's steps (step s-1: the dead client uploaded, its prediction is lost)
    np.testing.assert_allclose(weights[:s], w_ref[:s], atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(correct[:s - 1], correct_ref[:s - 1])
    np.testing.assert_array_equal(correct[s - 1, :kill], correct_ref[s - 1, :kill])
    diff = float((torch.tensor(record["logits"][:s - 1]) - logits_ref[:s - 1]).abs().max())
    assert diff <= TOLERANCE
    # from the kill on: the engine with the dead client absent (it gets no weight in the others' rows)
    np.testing.assert_allclose(weights[s:], w_abs[s:], atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(correct[s:, :kill], correct_abs[s:, :kill])
    live = torch.tensor([[row[i] for i in range(kill)] for row in record["logits"][s:]])
    assert float((live - logits_abs[s:, :kill]).abs().max()) <= TOLERANCE


@needs_cli
def test_killed_supernode_below_min_clients_stops_and_keeps_steps(tmp_path):
    clients, steps, kill = 2, 3, 1
    record = _kill_after(tmp_path, clients, steps, kill, after=1, min_clients=0)  # 0: all clients (the default)
    status = record["status"]
    assert status.startswith("stopped: ") and "min-clients is 2" in status and f"client {kill}:" in status, status
    assert record["flower_status"].get("status") == "finished:failed", record["flower_status"]
    done = record["steps_done"]
    assert record["killed_at"] <= done < steps and len(record["correct"]) == len(record["weights"]) == done
    cfg = _cfg(clients, steps)
    w_ref, correct_ref, _ = engine_reference(cfg, build_stream(cfg, "cpu"), steps)
    np.testing.assert_allclose(np.array(record["weights"]), w_ref[:done], atol=TOLERANCE, rtol=0)
    correct = _as_array(record["correct"])
    np.testing.assert_array_equal(correct[:done - 1], correct_ref[:done - 1])
    assert correct[done - 1, 0] == correct_ref[done - 1, 0] and record["correct"][done - 1][kill] is None


@needs_cli
@pytest.mark.skipif(os.environ.get("FTTA_SLOW_FLOWER_TESTS") != "1",
                    reason="~2 min more on 2 cores: set FTTA_SLOW_FLOWER_TESTS=1 (the in-process rejoin test "
                           "always runs)")
def test_restarted_supernode_rejoins(tmp_path):
    """A SuperNode SIGKILLed, then started again for the same client: a new node id takes the client's slot."""
    clients, steps, kill = 3, 6, 2
    cfg, out = _cfg(clients, steps), tmp_path / "result.json"
    with Loopback(tmp_path) as net:
        net.start_superlink()
        for i in range(clients):
            net.start_supernode(f"supernode{i}", i, heartbeat=HEARTBEAT)
        net.wait_registered(clients)
        run_id = net.submit(dict(run_config_of(cfg, steps), timeout=RUN_TIMEOUT, out=str(out), **{"min-clients": 2}))
        dead = (f"supernode{kill}",)
        net.wait("1 step recorded", lambda: (read_record(out) or {}).get("steps_done", 0) >= 1, RUN_TIMEOUT, 0.2)
        net.kill(dead[0])
        net.wait(f"client {kill} recorded absent", lambda: any(r[kill] for r in read_record(out)["absent"]),
                 RUN_TIMEOUT, expect_dead=dead)
        net.start_supernode("restarted", kill, heartbeat=HEARTBEAT)
        net.wait_registered(clients + 1, expect_dead=dead)
        record = wait_for_end(net, out, run_id, 2 * RUN_TIMEOUT, expect_dead=dead)
    assert record["status"] == "finished", record["status"]
    rejoined = [e for e in record["events"] if e["event"] == "client rejoined"]
    assert len(rejoined) == 1 and rejoined[0]["client"] == kill, record["events"]
    back = rejoined[0]["step"]
    assert [row[kill] for row in record["absent"]][back:] == [False] * (steps - back)
    assert record["correct"][steps - 1][kill] is not None


# ---------------------------------------------------------------------------------------------------------------
# in process


def _tamper(kind: str) -> Callable[[Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]:
    def apply(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        name = sorted(state)[0]
        out = dict(state)
        if kind == "shape":
            out[name] = state[name][..., :-1]
        elif kind == "dtype":
            out[name] = state[name].double()
        elif kind == "missing":
            del out[name]
        elif kind == "extra":
            out["backdoor"] = torch.ones(3)
        elif kind == "x1e30":
            out[name] = state[name] * 1e30
        elif kind == "nan":
            out[name] = state[name].clone()
            out[name].view(-1)[0] = float("nan")
        return out

    return apply


def _faulty_client_app(inner: ClientApp, client: int, kind: str) -> ClientApp:
    """``inner`` whose client ``client`` sends a malformed upload (``kind``) or raises."""
    app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        if int(context.node_config["client"]) == client and kind == "raises" and msg.metadata.group_id != "0":
            raise RuntimeError("the ClientApp crashed")  # from step 1 on
        reply = inner(msg, context)
        if int(context.node_config["client"]) == client and "state" in reply.content:
            if kind == "size":
                reply.content["meta"]["n"] = 10 ** 9  # would take all of FedAvg's weight
            else:
                reply.content["state"] = to_record(_tamper(kind)(from_record(reply.content["state"])))
        return reply

    app.train()(handle)
    app.evaluate()(handle)
    return app


@pytest.mark.parametrize("kind", ["shape", "dtype", "missing", "extra", "x1e30", "nan", "size", "raises"])
def test_one_malformed_upload_is_rejected_others_unaffected(kind, one_thread):
    clients, steps, bad = 3, 2, 1
    cfg = _cfg(clients, steps)
    stream = build_stream(cfg, "cpu")
    run = FlowerRun()
    run_inprocess(engine_server_app(cfg, steps, run, timeout=30.0, min_clients=2),  # a crashed client is absent
                  _faulty_client_app(engine_client_app(cfg, stream), bad, kind),
                  [{"client": i} for i in range(clients)])
    record = run.record
    assert record["status"] == "finished" and record["steps_done"] == steps
    first = 1 if kind == "raises" else 0  # the first step with the fault
    flag, other = ("absent", "rejected") if kind == "raises" else ("rejected", "absent")
    # a ClientApp that raises from step 1 on dies in step 0 too: it uploaded, its prediction never came (absent,
    # its upload counted in W)
    marked = first - 1 if kind == "raises" else first
    assert [row[bad] for row in record[flag]] == [t >= marked for t in range(steps)], record[flag]
    assert sum(map(sum, record[flag])) == steps - marked and not np.array(record[other]).any()
    reasons = [record["reasons"][t][str(bad)] for t in range(marked, steps)]
    expected = {"shape": "shape", "dtype": "dtype", "missing": "missing upload", "extra": "unexpected upload",
                "x1e30": "RMS", "nan": "NaN", "size": "samples", "raises": "the ClientApp crashed"}[kind]
    assert all(expected in r for r in reasons), reasons
    # the others get exactly what they get with that client absent; a rejected client keeps its own model
    w_ref, correct_ref, logits_ref = engine_reference(cfg, stream, steps, absent_from={bad: first})
    weights = np.stack(run.weights)
    np.testing.assert_allclose(weights, w_ref, atol=TOLERANCE, rtol=0)
    assert np.all(weights[first:, [0, 2], bad] == 0)
    correct = _as_array(record["correct"])
    if kind == "raises":  # no prediction from the step before the crash on
        assert [row[bad] for row in record["correct"]] == [None] * steps
        keep = [i for i in range(clients) if i != bad]
        np.testing.assert_array_equal(correct[:, keep], correct_ref[:, keep])
    else:
        np.testing.assert_array_equal(correct, correct_ref)
        assert float((torch.stack(run.logits) - logits_ref).abs().max()) <= TOLERANCE


class _KillGrid(LocalGrid):
    """Kills client ``KILL``'s node when round ``AT`` is pushed (before delivery), and, with ``REJOIN``, starts a
    fresh node for that client when round ``REJOIN`` is pushed (it is contacted from the next round)."""

    KILL, AT, REJOIN = 1, 2, None

    def push_messages(self, messages):
        messages = list(messages)
        group = messages[0].metadata.group_id if messages else ""
        if group == str(self.AT) and self.KILL + 1000 not in self.offline:
            self.remove_node(1000 + self.KILL)
        if self.REJOIN is not None and group == str(self.REJOIN) and len(self.contexts) == 3:
            self.add_node({"client": self.KILL})
        return super().push_messages(messages)


def test_inprocess_node_lost_below_min_clients_stops_with_record(tmp_path, one_thread):
    cfg = _cfg(3, 4)
    run = FlowerRun()
    with pytest.raises(StopRun, match="step 2: 2 of 3 clients answered, min-clients is 3"):
        run_inprocess(engine_server_app(cfg, 4, run, timeout=30.0), engine_client_app(cfg, build_stream(cfg, "cpu")),
                      [{"client": i} for i in range(3)], grid_class=_KillGrid)
    record = run.record
    assert record["status"].startswith("stopped: step 2: 2 of 3 clients answered") and record["steps_done"] == 2
    assert "client 1: its SuperNode went offline" in record["status"]
    assert record["correct"][1][1] is None and None not in record["correct"][0]
    assert [row[1] for row in record["absent"]] == [False, True]  # died at step 1: absent at the step it died


def test_inprocess_restarted_node_rejoins_its_slot(one_thread):
    class Rejoin(_KillGrid):
        REJOIN = 3

    cfg = _cfg(3, 6)
    stream = build_stream(cfg, "cpu")
    run = FlowerRun()
    run_inprocess(engine_server_app(cfg, 6, run, timeout=30.0, min_clients=2), engine_client_app(cfg, stream),
                  [{"client": i} for i in range(3)], grid_class=Rejoin)
    record = run.record
    assert record["status"] == "finished" and record["steps_done"] == 6
    # step 1: it uploaded, then died before its prediction came back (absent, its upload in W); 2-3: gone
    assert [row[1] for row in record["absent"]] == [False, True, True, True, False, False]
    assert "its prediction never came (its SuperNode went offline)" in record["reasons"][1]["1"]
    assert [e["event"] for e in record["events"]] == ["client rejoined"]
    assert record["events"][0]["client"] == 1 and record["events"][0]["step"] == 4
    assert record["correct"][1][1] is None and record["correct"][4][1] is not None  # predicts again after rejoining
    # back in W: with FedAvg every accepted client weighs 1/3 again
    np.testing.assert_allclose(np.array(record["weights"][4]), np.full((3, 3), 1 / 3), atol=1e-6)
    # before the loss, the uninterrupted run
    w_ref, correct_ref, _ = engine_reference(cfg, stream, 6)
    np.testing.assert_array_equal(_as_array(record["correct"][:1]), correct_ref[:1])


# ---------------------------------------------------------------------------------------------------------------
# the server's heartbeat: a dead server's record is interrupted, not running

SLOW_SERVER = """
import sys
import time

from ftta_core.experiment import ExperimentConfig
from ftta_core.flower import engine_app

reply = engine_app.client_reply


def slow_reply(client, msg):  # a step takes a while, as on real clients
    time.sleep(0.2)
    return reply(client, msg)


engine_app.client_reply = slow_reply
cfg = ExperimentConfig(dataset="embedded_digits", clients=2, local="bn", strategy="fedavg", backend="loop",
                       device="cpu", max_steps=300, seed=0)
engine_app.run_engine_on_flower(cfg, out=sys.argv[1])
"""


def test_a_killed_server_process_leaves_a_record_runs_reports_interrupted(tmp_path, capsys):
    """A real process runs the ServerApp (clients in process) and is SIGKILLed after one recorded step: its record
    still says ``running`` (nothing could write more), but its heartbeat names a dead process, so ``runs`` reports
    it interrupted; while it lived, running."""
    import signal
    import subprocess
    import sys

    from ftta_core.cli import main
    from ftta_core.runstore import scan

    out = tmp_path / "flower" / "record.json"
    out.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVER, str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while (read_record(out) or {}).get("steps_done", 0) < 1 and proc.poll() is None:
            assert time.monotonic() < deadline, "no step recorded in 180 s"
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        beat = read_record(out)["heartbeat"]
        assert beat["pid"] == proc.pid and beat["host"] and beat["interval_s"] == 30.0
        assert [e.status for e in scan(tmp_path)] == ["running"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    record = read_record(out)
    assert record["status"] == "running" and record["steps_done"] >= 1
    assert [e.status for e in scan(tmp_path)] == ["interrupted"]
    assert main(["runs", str(tmp_path), "--list", "interrupted"]) == 0
    shown = capsys.readouterr().out
    assert "interrupted" in shown and str(out) in shown


def test_heartbeat_status_tells_a_dead_or_silent_server_from_a_live_one():
    import socket
    import subprocess
    import sys

    from ftta_core.runstore import HEARTBEAT_STALE, heartbeat, heartbeat_status

    beat = heartbeat(30.0)
    assert heartbeat_status(beat) == "running"
    assert heartbeat_status(beat, now=beat["time"] + HEARTBEAT_STALE * 30 + 1) == "interrupted"  # hung: silent
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert heartbeat_status({**beat, "pid": int(gone.stdout)}) == "interrupted"  # its process is gone
    elsewhere = {**beat, "host": socket.gethostname() + "-other", "pid": 1}
    assert heartbeat_status(elsewhere) == "running"  # another machine: only its age tells
    assert heartbeat_status({**elsewhere, "time": beat["time"] - 1000}) == "interrupted"


def test_a_restarted_server_never_replaces_a_live_record_and_notes_a_dead_one(tmp_path, one_thread):
    import json

    from ftta_core.runstore import heartbeat

    cfg = _cfg(2, 2)
    stream = build_stream(cfg, "cpu")
    out = tmp_path / "record.json"
    live = {"status": "running", "steps_done": 1, "heartbeat": heartbeat(30.0)}  # this process: alive
    out.write_text(json.dumps(live))
    with pytest.raises(StopRun, match="whose ServerApp is alive"):
        run_inprocess(engine_server_app(cfg, 2, FlowerRun(), timeout=30.0, out=str(out)),
                      engine_client_app(cfg, stream), [{"client": i} for i in range(2)])
    assert json.loads(out.read_text()) == live  # untouched
    dead = {**live, "heartbeat": {**live["heartbeat"], "host": "elsewhere", "time": 0.0, "utc": "1970-01-01"}}
    out.write_text(json.dumps(dead))
    run = FlowerRun()
    run_inprocess(engine_server_app(cfg, 2, run, timeout=30.0, out=str(out)), engine_client_app(cfg, stream),
                  [{"client": i} for i in range(2)])
    record = json.loads(out.read_text())
    assert record["status"] == "finished" and record["steps_done"] == 2
    assert record["events"][0] == {"step": 0, "event": "replaced a former record", "status": "interrupted",
                                   "steps_done": 1, "last_written": "1970-01-01"}
