"""A Flower deployment on one machine, over 127.0.0.1: a ``flower-superlink``, ``flower-supernode`` processes and
``flwr run`` (what ``tests/test_flower_deployment.py`` and ``tests/test_flower_faults.py`` start, and a way to try
the app's deployment before using several machines).

Every process is started in its own session; ``stop`` terminates, then kills, each one's whole process group (the
SuperExec, ServerApp and ClientApp processes Flower spawns beneath it) with bounded waits, and ``kill`` SIGKILLs
one of them (a SuperNode dying without a word). Flower 1.41's ``flower-supernode`` has no
``--disable-runtime-dependency-installation`` flag (it rejects it): on the SuperNode runtime installation is off
unless ``--allow-runtime-dependency-installation`` is given, so only the SuperLink gets the disable flag.

``heartbeat``: a SuperNode started with ``heartbeat=10`` sends heartbeats every ~10 s instead of Flower's 30 s
(``HEARTBEAT_DEFAULT_INTERVAL``; the SuperLink accepts 10 s to 30 min), so the SuperLink marks it offline ~20 s after
it dies instead of ~60 s (two missed intervals): for tests that kill SuperNodes. Flower has no option for it; the
SuperNode then runs as ``python -m ftta_core.flower.loopback supernode --heartbeat S -- ARGS`` which sets the
interval in Flower's SuperNode modules and starts ``flower-supernode ARGS``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr are installed next to python
START_TIMEOUT = 120.0  # SuperLink listening / SuperNodes registered / `flwr run` submitted


class LoopbackError(RuntimeError):
    """A process of the loopback deployment failed or did not get ready in time (the message has their logs)."""


def cli_available() -> bool:
    """Whether flwr's ``flower-superlink`` and ``flower-supernode`` are installed next to this python."""
    return (BIN / "flower-superlink").exists() and (BIN / "flower-supernode").exists()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tail(path: Path, n: int = 40) -> str:
    """The last ``n`` lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no output)"


def toml_value(v: Any) -> str:
    """``v`` as a TOML value (a JSON string is a TOML basic string)."""
    return json.dumps(v) if isinstance(v, str) else repr(v)


class Loopback:
    """A SuperLink and SuperNodes on 127.0.0.1 with their logs under ``workdir``; use as a context manager (or
    call ``stop`` in ``finally``)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, FLWR_HOME=str(self.home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
                        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # Flower spawns its tools by name
        self.procs: Dict[str, tuple] = {}  # name -> (Popen, log path)
        self.port: Optional[int] = None

    def __enter__(self) -> "Loopback":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- processes
    def start(self, name: str, args: List[str]) -> subprocess.Popen:
        """Start ``args`` (``args[0]`` a tool next to python, or python itself) in its own session."""
        log = self.workdir / f"{name}.log"
        exe = sys.executable if args[0] == "python" else str(BIN / args[0])
        with log.open("wb") as fh:
            proc = subprocess.Popen([exe, *args[1:]], stdout=fh, stderr=subprocess.STDOUT, cwd=self.workdir,
                                    env=self.env, start_new_session=True)
        self.procs[name] = (proc, log)
        return proc

    def start_superlink(self, simulation: bool = False) -> int:
        """Start the SuperLink (Control, Fleet and Runtime APIs on one port), wait until it listens, and name it
        ``loopback`` in ``$FLWR_HOME/config.toml`` for ``flwr run``; returns the port."""
        self.port = free_port()
        (self.home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                               f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                                 "--port", str(self.port)] + (["--simulation"] if simulation else []))
        port = self.port
        self.wait(f"the SuperLink to listen on 127.0.0.1:{port}", lambda: listening(port), START_TIMEOUT)
        return port

    def start_supernode(self, name: str, client: int, heartbeat: Optional[float] = None) -> subprocess.Popen:
        """Start a SuperNode for client ``client`` (``--node-config client=i``); ``heartbeat``: its heartbeat
        interval in seconds (module docstring; None: Flower's)."""
        args = ["--insecure", "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()),
                "--node-config", f"client={client}"]
        if heartbeat is None:
            return self.start(name, ["flower-supernode", *args])
        return self.start(name, ["python", "-m", "ftta_core.flower.loopback", "supernode", "--heartbeat",
                                 str(heartbeat), "--", *args])

    def registered(self) -> int:
        """How many SuperNode activations the SuperLink has logged (a restarted SuperNode counts again)."""
        return self.log("superlink").count("Activated node_id")

    def wait_registered(self, n: int, expect_dead: tuple = ()) -> None:
        """Wait until the SuperLink has activated ``n`` SuperNodes (``expect_dead``: processes killed on purpose)."""
        self.wait(f"{n} SuperNodes to register", lambda: self.registered() >= n, START_TIMEOUT,
                  expect_dead=expect_dead)

    def kill(self, name: str) -> None:
        """SIGKILL process ``name`` and everything it started (no goodbye to the SuperLink)."""
        proc, _ = self.procs[name]
        self._signal(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """Terminate, then kill, every started process group (bounded waits)."""
        procs = [p for p, _ in reversed(list(self.procs.values()))]
        for proc in procs:
            self._signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._signal(proc, signal.SIGKILL)  # the group: children that outlived their parent too
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def alive(self) -> List[str]:
        """The started processes still running."""
        return [name for name, (p, _) in self.procs.items() if p.poll() is None]

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the started process's id
        except (ProcessLookupError, PermissionError):
            pass

    # -- logs and waiting
    def log(self, name: str) -> str:
        _, path = self.procs[name]
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def report(self) -> str:
        return "\n".join(f"--- {name} (pid {p.pid}, exit {p.poll()}) last lines of {log}:\n{tail(log)}"
                         for name, (p, log) in self.procs.items())

    def wait(self, what: str, cond: Callable[[], bool], timeout: float, interval: float = 0.5,
             expect_dead: tuple = ()) -> None:
        """Wait until ``cond()``; fail (``LoopbackError``) on timeout or when a process other than
        ``expect_dead`` exited."""
        deadline = time.monotonic() + timeout
        while not cond():
            dead = [n for n, (p, _) in self.procs.items() if p.poll() is not None and n not in expect_dead]
            if dead:
                raise LoopbackError(f"{dead} exited early while waiting for {what}\n{self.report()}")
            if time.monotonic() > deadline:
                raise LoopbackError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.report()}")
            time.sleep(interval)

    # -- runs
    def flwr(self, *args: str, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this deployment."""
        return subprocess.run([str(BIN / "flwr"), *args], capture_output=True, text=True, env=self.env,
                              cwd=self.workdir, timeout=timeout)

    def submit(self, run_config: Mapping[str, Any], name: str = "run", federation_config: str = "") -> int:
        """``flwr run`` the ftta app with ``run_config`` (written to ``NAME-config.toml``); returns the run id."""
        from .deploy import APP_DIR

        path = self.workdir / f"{name}-config.toml"
        path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
        extra = ["--federation-config", federation_config] if federation_config else []
        run = self.flwr("run", str(APP_DIR), "loopback", "--run-config", str(path), "--format", "json", *extra)
        if run.returncode != 0 or '"success": true' not in run.stdout:
            raise LoopbackError(f"flwr run failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}\n"
                                f"{self.report()}")
        return int(json.loads(run.stdout[run.stdout.index("{"):])["run-id"])

    def run_status(self, run_id: int) -> Dict[str, Any]:
        """``flwr ls --run-id`` as a dict (keys include 'status', e.g. 'finished:completed' or 'finished:failed')."""
        res = self.flwr("ls", "loopback", "--run-id", str(run_id), "--format", "json")
        if res.returncode != 0:
            raise LoopbackError(f"flwr ls failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}")
        data = json.loads(res.stdout[res.stdout.index("{"):])
        runs = data.get("runs") or []
        return runs[0] if runs else data


def read_record(path: Path) -> Optional[Dict[str, Any]]:
    """The ServerApp's JSON record at ``path`` (None while there is none); it is replaced atomically, so a reader
    sees a whole record."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def _supernode_main(argv: List[str]) -> None:
    """``supernode --heartbeat S -- ARGS``: flower-supernode ARGS with a heartbeat every ~S seconds."""
    if len(argv) < 3 or argv[0] != "--heartbeat" or argv[2] != "--":
        raise SystemExit("usage: python -m ftta_core.flower.loopback supernode --heartbeat SECONDS -- ARGS")
    interval = float(argv[1])
    import flwr.supercore.heartbeat as heartbeat
    import flwr.supernode.fleet_http_connection as connection
    from flwr.supernode.cli import flower_supernode

    for module in (heartbeat, connection):  # the interval the SuperNode announces and the one it keeps
        if not hasattr(module, "HEARTBEAT_DEFAULT_INTERVAL"):
            raise SystemExit(f"{module.__name__} has no HEARTBEAT_DEFAULT_INTERVAL (flwr changed): drop heartbeat=")
        module.HEARTBEAT_DEFAULT_INTERVAL = interval
    sys.argv = ["flower-supernode", *argv[3:]]
    flower_supernode()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "supernode":
        raise SystemExit("usage: python -m ftta_core.flower.loopback supernode --heartbeat SECONDS -- ARGS")
    _supernode_main(sys.argv[2:])
