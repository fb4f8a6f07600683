"""The collaboration explorer: W over time of any stored run, clients grouped by the domain they see.

A stored run is a folder holding ``collaboration.npz`` (W [T, N, N], one matrix per step) and ``summary.json`` (its
config): ``python -m ftta_core run --out`` folders, and ``workbook.run_stored``'s per-strategy folders (which add
``slots.csv``, the domain of every client in every slot). ``find_runs`` lists them under folders; ``explore`` shows
them:

* in an interactive frontend (a kernel started by JupyterLab / Jupyter Notebook, ipywidgets installed): a widget
  (``CollaborationExplorer``) with a run selector, a step slider (and a play button) and a client selector; it shows
  W at the step, rows and columns ordered by the clients' domain at that step with the groups' boundaries drawn and
  their domains named, beside the chosen client's row of W over all steps; one fixed colour scale, [0, 1];
* elsewhere (papermill, nbval, a script) or without ipywidgets: a static figure (``snapshot_figure``): W at a few
  steps spread over the run and the client's row over time, on the same scale, so executed notebooks show a figure.

``interactive=True`` / ``False`` forces either (e.g. ``True`` in a frontend that does not start kernels through
Jupyter's server, such as VS Code).
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .notebooks import FRONTEND_ENV
from .progress import in_kernel
from .style import W_CMAP, W_LABEL, W_RANGE, draw_groups

RunSource = Union[str, Path, "CollaborationRun"]
STATIC_STEPS = 4  # W snapshots in the static figure


@dataclass(frozen=True)
class CollaborationRun:
    """W over time of one stored run, with the domain of every client at every step where known."""

    name: str
    weights: np.ndarray  # [T, N, N]: row i is how much client i takes from each client j
    domains: Optional[np.ndarray] = None  # [T, N] domain names
    slot_steps: Optional[int] = None  # steps per slot (the scenario's), for slot lines and labels
    config: Optional[Dict[str, Any]] = None

    @property
    def n_steps(self) -> int:
        """Number of recorded steps T."""
        return int(self.weights.shape[0])

    @property
    def n_clients(self) -> int:
        """Number of clients N."""
        return int(self.weights.shape[1])

    def slot_of(self, step: int) -> Optional[int]:
        """The slot of ``step`` (None when the slot length is unknown)."""
        return None if not self.slot_steps else step // self.slot_steps

    def describe(self, step: int) -> str:
        """'step s (slot k)' for titles."""
        slot = self.slot_of(step)
        return f"step {step}" + ("" if slot is None else f" (slot {slot})")


def find_runs(*roots: Path | str, where: Optional[Callable[[Dict[str, Any]], bool]] = None) -> Dict[str, Path]:
    """Every stored run with W under ``roots`` (folders holding ``collaboration.npz`` and ``summary.json``) whose
    config satisfies ``where`` (all when None), by its path relative to its root (prefixed by the root's name when
    several roots are given), sorted."""
    found: Dict[str, Path] = {}
    for root in map(Path, roots):
        for npz in sorted(root.rglob("collaboration.npz")):
            folder = npz.parent
            if (folder / "summary.json").exists() and (
                    where is None or where(json.loads((folder / "summary.json").read_text()).get("config") or {})):
                rel = folder.relative_to(root).as_posix()
                name = rel if len(roots) == 1 else f"{root.name}/{rel}"
                found[name if rel != "." else root.name] = folder
    return dict(sorted(found.items()))


def run_domains(config: Optional[Dict[str, Any]], n_steps: int, slots: Optional[pd.DataFrame] = None
                ) -> Tuple[Optional[np.ndarray], Optional[int]]:
    """([T, N] domain names, steps per slot) of a run: from its config's scenario (``experiment.build_scenario``),
    else from its ``slots.csv`` table (slot, client, domain); (None, None) when neither says."""
    if config is not None:
        try:
            from .experiment import ExperimentConfig, build_scenario

            scenario = build_scenario(ExperimentConfig.from_dict(config))
            names = np.asarray(scenario.domain_names, dtype=object)
            last = scenario.n_steps - 1
            return (np.stack([names[scenario.domains_at(min(t, last))] for t in range(n_steps)]),
                    scenario.slot_steps)
        except Exception:  # a config of another version, or a scenario a plugin registers: try slots.csv
            pass
    if slots is not None and {"slot", "client", "domain"} <= set(slots.columns):
        table = slots.pivot(index="slot", columns="client", values="domain").sort_index()
        slot_steps = max(1, n_steps // len(table))
        rows = [table.iloc[min(t // slot_steps, len(table) - 1)].to_numpy(dtype=object) for t in range(n_steps)]
        return np.stack(rows), slot_steps
    return None, None


def load_run(folder: Path | str, name: Optional[str] = None) -> CollaborationRun:
    """A stored run folder's W over time and its clients' domains (``run_domains``)."""
    folder = Path(folder)
    weights = np.load(folder / "collaboration.npz")["W"]
    summary = json.loads((folder / "summary.json").read_text())
    slots = pd.read_csv(folder / "slots.csv") if (folder / "slots.csv").exists() else None
    domains, slot_steps = run_domains(summary.get("config"), weights.shape[0], slots)
    return CollaborationRun(name or folder.name, weights, domains, slot_steps, summary.get("config"))


@lru_cache(maxsize=32)
def _load_cached(folder: str, name: str) -> CollaborationRun:
    return load_run(folder, name)


def resolve(name: str, source: RunSource) -> CollaborationRun:
    """A ``CollaborationRun`` from a run or a folder (folders are read once and cached)."""
    return source if isinstance(source, CollaborationRun) else _load_cached(str(Path(source).resolve()), name)


def domain_groups(domains: Optional[Sequence[str]], n_clients: int) -> Tuple[np.ndarray, List[str]]:
    """(client order, each ordered client's group label): clients grouped by domain, groups in the order of their
    first client, clients ascending within a group; one group in client order when the domains are unknown."""
    if domains is None:
        return np.arange(n_clients), [""] * n_clients
    domains = [str(d) for d in domains]
    first = {d: domains.index(d) for d in domains}
    order = np.array(sorted(range(n_clients), key=lambda i: (first[domains[i]], i)))
    return order, [domains[i] for i in order]


def _group_spans(labels: Sequence[str]) -> List[Tuple[str, int, int]]:
    """(label, first, last) of each run of equal labels."""
    spans: List[Tuple[str, int, int]] = []
    for i, label in enumerate(labels):
        if spans and spans[-1][0] == label:
            spans[-1] = (label, spans[-1][1], i)
        else:
            spans.append((label, i, i))
    return spans


def draw_matrix(ax: Any, run: CollaborationRun, step: int, title: Optional[str] = None) -> Any:
    """W at ``step`` on [0, 1], rows and columns ordered by the clients' domain at that step, the groups' boundaries
    drawn and their domains named on the right. Returns the image."""
    order, labels = domain_groups(None if run.domains is None else run.domains[step], run.n_clients)
    image = ax.imshow(run.weights[step][np.ix_(order, order)], vmin=W_RANGE[0], vmax=W_RANGE[1], cmap=W_CMAP,
                      interpolation="nearest")
    ax.grid(False)  # the workbook style's grid would cross the matrix
    draw_groups(ax, labels, offset=-0.5)
    ticks = np.arange(run.n_clients)
    ax.set_xticks(ticks, [str(c) for c in order], fontsize=7)
    ax.set_yticks(ticks, [str(c) for c in order], fontsize=7)
    for label, first, last in _group_spans(labels):
        if label:
            ax.annotate(label, xy=(1.02, 1 - (first + last + 1) / (2 * run.n_clients)), xycoords="axes fraction",
                        va="center", ha="left", fontsize=7, annotation_clip=False)
    ax.set(xlabel="from client j", ylabel="client i", title=title if title is not None else run.describe(step))
    return image


def draw_client_row(ax: Any, run: CollaborationRun, client: int, step: Optional[int] = None) -> Any:
    """Row ``client`` of W at every step (clients j on the y axis, in the domain order of ``step``, or of the first
    step), slot boundaries as thin lines and ``step`` marked. Returns the image."""
    at = 0 if step is None else step
    order, labels = domain_groups(None if run.domains is None else run.domains[at], run.n_clients)
    row = run.weights[:, client, :][:, order].T
    image = ax.imshow(row, aspect="auto", vmin=W_RANGE[0], vmax=W_RANGE[1], cmap=W_CMAP, interpolation="nearest")
    ax.grid(False)
    draw_groups(ax, labels, columns=False, offset=-0.5)
    if run.slot_steps:
        for x in range(run.slot_steps, run.n_steps, run.slot_steps):
            ax.axvline(x - 0.5, color="white", lw=0.4, alpha=0.5)
    if step is not None:
        ax.axvline(step, color="red", lw=1.2)
    ax.set_yticks(np.arange(run.n_clients), [str(c) for c in order], fontsize=7)
    own = "" if run.domains is None else f", its domain at {run.describe(at)}: {run.domains[at][client]}"
    ax.set(xlabel="step", ylabel="weight on client j", title=f"client {client}'s row of W over time{own}")
    return image


def explorer_figure(run: CollaborationRun, step: int, client: int, fig: Optional[Figure] = None) -> Figure:
    """One view of the explorer: W at ``step`` beside ``client``'s row over time, one colour bar on [0, 1]
    (``fig`` is cleared and reused when given)."""
    fig = fig if fig is not None else Figure(figsize=(11, 4.2), layout="constrained")
    fig.clear()
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    image = draw_matrix(left, run, step, title=f"{run.name}\nW at {run.describe(step)}")
    draw_client_row(right, run, client, step)
    fig.colorbar(image, ax=[left, right], label=W_LABEL, shrink=0.8)
    return fig


def snapshot_steps(run: CollaborationRun, n: int = STATIC_STEPS) -> List[int]:
    """``n`` steps spread over the run: the middle step of evenly spaced slots (of evenly spaced steps when the slot
    length is unknown)."""
    if run.slot_steps:
        n_slots = -(-run.n_steps // run.slot_steps)
        slots = np.unique(np.linspace(0, n_slots - 1, min(n, n_slots)).round().astype(int))
        return [int(min(s * run.slot_steps + run.slot_steps // 2, run.n_steps - 1)) for s in slots]
    return [int(s) for s in np.unique(np.linspace(0, run.n_steps - 1, min(n, run.n_steps)).round().astype(int))]


def snapshot_figure(run: CollaborationRun, steps: Optional[Sequence[int]] = None, client: int = 0) -> Any:
    """The static explorer: W at ``steps`` (default ``snapshot_steps``) in one row, ``client``'s row of W over time
    below, one colour bar on [0, 1]. A pyplot figure: a notebook's backend shows it like any other figure."""
    import matplotlib.pyplot as plt

    steps = list(steps) if steps is not None else snapshot_steps(run)
    fig = plt.figure(figsize=(max(11.0, 2.9 * len(steps)), 6.2), layout="constrained")
    grid = fig.add_gridspec(2, len(steps), height_ratios=[1.25, 1])
    tops = [fig.add_subplot(grid[0, i]) for i in range(len(steps))]
    for ax, step in zip(tops, steps):
        image = draw_matrix(ax, run, step)
    bottom = fig.add_subplot(grid[1, :])
    draw_client_row(bottom, run, client)
    for step in steps:
        bottom.axvline(step, color="red", lw=0.8, ls=":")
    fig.colorbar(image, ax=[*tops, bottom], label=W_LABEL, shrink=0.8)
    fig.suptitle(f"{run.name}: W at {len(steps)} steps (clients grouped by domain; interactive explorer in "
                 "JupyterLab)")
    return fig


def interactive_frontend() -> bool:
    """Whether widgets will be seen: in a kernel that a Jupyter server started for a notebook (it sets
    ``JPY_SESSION_NAME``; papermill, nbval and ``python -m ftta_core notebooks`` kernels have none) with ipywidgets
    installed."""
    return in_kernel() and FRONTEND_ENV in os.environ and find_spec("ipywidgets") is not None


class CollaborationExplorer:
    """The interactive explorer (ipywidgets): run selector, step slider with a play button, client selector, and
    the view of ``explorer_figure`` as a PNG image that each change redraws. ``widget`` is the whole layout; the
    explorer displays as it in a notebook. ``shown`` is (run, step, client) of the view on screen."""

    def __init__(self, runs: Mapping[str, RunSource], run: Optional[str] = None, step: int = 0, client: int = 0):
        import ipywidgets as widgets

        if not runs:
            raise ValueError("no stored run with W to explore (find_runs found none)")
        self.runs = dict(runs)
        first = resolve(run or next(iter(self.runs)), self.runs[run or next(iter(self.runs))])
        self.run_select = widgets.Dropdown(options=list(self.runs), value=run or next(iter(self.runs)),
                                           description="run", layout=widgets.Layout(width="460px"))
        self.step_slider = widgets.IntSlider(value=min(step, first.n_steps - 1), min=0, max=first.n_steps - 1,
                                             description="step", continuous_update=False,
                                             layout=widgets.Layout(width="520px"))
        self.play = widgets.Play(value=self.step_slider.value, min=0, max=first.n_steps - 1, interval=300)
        widgets.jslink((self.play, "value"), (self.step_slider, "value"))
        self.client_select = widgets.Dropdown(options=self._client_options(first), value=client,
                                              description="client", layout=widgets.Layout(width="180px"))
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.figure = Figure(figsize=(11, 4.2), layout="constrained")
        self.shown: Tuple[str, int, int] = ("", -1, -1)
        self._adjusting = False
        self.run_select.observe(self._run_changed, names="value")
        self.step_slider.observe(lambda _: self.update(), names="value")
        self.client_select.observe(lambda _: self.update(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.run_select, self.client_select]),
                                    widgets.HBox([self.play, self.step_slider]), self.caption, self.image])
        self.update()

    @staticmethod
    def _client_options(run: CollaborationRun) -> List[Tuple[str, int]]:
        return [(f"client {i}", i) for i in range(run.n_clients)]

    @property
    def run(self) -> CollaborationRun:
        """The selected run."""
        return resolve(self.run_select.value, self.runs[self.run_select.value])

    def _run_changed(self, _: Any) -> None:
        run, client = self.run, self.client_select.value or 0
        self._adjusting = True  # the controls follow the run's size; one redraw at the end
        try:
            self.step_slider.max = self.play.max = run.n_steps - 1
            self.client_select.options = self._client_options(run)
            self.client_select.value = min(client, run.n_clients - 1)
        finally:
            self._adjusting = False
        self.update()

    def update(self) -> None:
        """Redraw the view for the current selection."""
        if self._adjusting:
            return
        run, step, client = self.run, self.step_slider.value, self.client_select.value
        explorer_figure(run, step, client, self.figure)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=90)
        self.image.value = buffer.getvalue()
        cfg = run.config or {}
        what = ", ".join(f"{k} {cfg[k]}" for k in ("dataset", "scenario", "local", "strategy", "seed") if k in cfg)
        self.caption.value = f"<b>{run.name}</b>: {what}; {run.n_clients} clients, {run.n_steps} steps"
        self.shown = (self.run_select.value, step, client)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def run_name(runs: Mapping[str, RunSource], run: Optional[str | Path] = None) -> str:
    """The key of ``run`` in ``runs``: ``run`` itself, or the key of the folder ``run`` names; the first key when
    ``run`` is None."""
    if run is None:
        return next(iter(runs))
    if str(run) in runs:
        return str(run)
    folder = Path(run).resolve()
    match = [k for k, v in runs.items() if not isinstance(v, CollaborationRun) and Path(v).resolve() == folder]
    if not match:
        raise KeyError(f"{run} is none of the runs {list(runs)}")
    return match[0]


def explore(runs: Mapping[str, RunSource], run: Optional[str | Path] = None, step: Optional[int] = None,
            client: int = 0, interactive: Optional[bool] = None) -> Any:
    """The explorer over ``runs`` (name -> run folder or ``CollaborationRun``, e.g. ``find_runs(...)``), starting at
    ``run`` (a key or a run folder; default: the first), ``step`` (default: the first snapshot step) and ``client``.

    Interactive (``interactive_frontend()`` unless forced): displays the widget and returns the
    ``CollaborationExplorer``. Static: returns ``snapshot_figure`` of ``run`` (W at a few steps, ``step`` among
    them), which the notebook's backend shows.
    """
    if not runs:
        raise ValueError("no stored run with W to explore (find_runs found none)")
    name = run_name(runs, run)
    chosen = resolve(name, runs[name])
    if interactive if interactive is not None else interactive_frontend():
        from IPython.display import display

        explorer = CollaborationExplorer(runs, name, step if step is not None else snapshot_steps(chosen)[0], client)
        display(explorer.widget)
        return explorer
    steps = snapshot_steps(chosen)
    if step is not None and step not in steps:
        steps = sorted([*steps[:-1], min(step, chosen.n_steps - 1)])
    return snapshot_figure(chosen, steps, client)


__all__ = ["CollaborationRun", "CollaborationExplorer", "find_runs", "load_run", "resolve", "run_name",
           "run_domains", "domain_groups", "draw_matrix", "draw_client_row", "explorer_figure", "snapshot_steps",
           "snapshot_figure", "interactive_frontend", "explore"]
