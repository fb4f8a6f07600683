"""Command line: ``python -m ftta_core {run,train-source,eval-source,gallery,notebooks} ...``."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from .cli_config import (CommandParser, YamlLoader, _yaml_problem, add_config_options, config_values, key_values,  # noqa: F401
                         merge_config)
from .project import layout

# paper.TTA_SETTINGS' names (kept literal so the parser starts without torch; a test checks they agree)
TTA_CHOICES = ("bn", "grad", "grad-adam", "grad-running", "grad-running-adam")


def read_config(path: Path) -> Dict[str, Any]:
    """The config fields in YAML file ``path``; a missing, unreadable, malformed or non-mapping file raises
    ``ValueError`` naming it."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(f"config file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"config file '{path}' cannot be read: {err}") from None
    try:
        data = yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as err:
        raise ValueError(f"config file '{path}' is not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        got = "nothing (the file is empty or null)" if data is None else f"a {type(data).__name__}"
        raise ValueError(f"config file '{path}' must hold a mapping of config fields ('field: value' lines), "
                         f"got {got}")
    return data


_ARGV: Optional[List[str]] = None  # the arguments ``main`` was called with (None: the process's own)


def this_command() -> str:
    """The command line that is running, as a user would type it (written into every generated table and card):
    the arguments given to ``main``, or the process's when it was started from a shell."""
    args = sys.argv[1:] if _ARGV is None else _ARGV
    return "python -m ftta_core " + " ".join(shlex.quote(a) for a in args)


def write_markdown(path: Path, body: str) -> None:
    """Write a generated markdown table whose first line is the command that made it, and print it."""
    md = f"Made by: `{this_command()}`\n\n{body}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(md)
    print(md)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one federated test-time adaptation experiment",
                       description="Run a local TTA method with a server strategy over a shifting test stream. "
                                   "Writes OUT/summary.json, OUT/steps.csv and OUT/collaboration.npz; an "
                                   "interrupted run resumes from its last completed slot.")
    p.add_argument("--config", type=Path, help="YAML file with ExperimentConfig fields (flags override it)")
    p.defer(functools.partial(add_config_options, title="experiment config (the fields of ExperimentConfig; they "
                                                         "override --config)"))
    p.add_argument("--server-threads", type=int, dest="server_threads",
                   help="threads for server rounds computed ahead (FedTSA): 0 none; default torch's thread count "
                        "on a CPU, 2 on a GPU")
    p.add_argument("--out", type=run_folder, required=True,
                   help="run folder (locked while the run writes it; a finished run of the same config is read back)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished or unfinished run of another config in --out, or run a stale finished "
                        "run again (refused otherwise)")
    p.add_argument("--reuse-stale", action="store_true", dest="reuse_stale",
                   help="read back a finished run in --out although the code that made it changed meaning since "
                        "(refused otherwise)")
    p.set_defaults(func=cmd_run)


def run_folder(value: str) -> Path:
    """``--out``: a non-empty folder path (an empty one would write into the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty --out would write into the current folder; name a run folder")
    return Path(value)


def cmd_run(args: argparse.Namespace) -> int:
    from .experiment import ExperimentConfig, run_experiment

    from_file: set = set()
    try:
        data: Dict[str, Any] = read_config(args.config) if args.config else {}
        given = config_values(args)
        from_file = set(data) - {k for k in given if not k.endswith("_params")}  # params merge into the file's
        data = merge_config(data, given)
        cfg = ExperimentConfig.from_dict(data)
    except ValueError as exc:
        field = re.match(r"config field '(\w+)'", str(exc))
        where = f" (in config file '{args.config}')" if field and field.group(1) in from_file else ""
        print(f"error: {exc}{where}", file=sys.stderr)
        return 2
    if args.server_threads is not None and args.server_threads < 0:
        print(f"error: --server-threads must be >= 0, got {args.server_threads}", file=sys.stderr)
        return 2
    from .runstore import RunStoreError

    try:
        res = run_experiment(cfg, out=args.out, progress=True, server_threads=args.server_threads,
                             overwrite=args.overwrite, reuse_stale=args.reuse_stale)
    except RunStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    s = res.summary
    print(f"\n{cfg.local} + {cfg.strategy} on {cfg.dataset} / {cfg.scenario} ({cfg.clients} clients, seed {cfg.seed})")
    print(res.accuracy_table().round(2).to_string())
    print(f"accuracy: source {s['accuracy_source']:.2f}  local {s['accuracy_local']:.2f}  "
          f"mixed {s['accuracy']:.2f}   ({s['wall_time_s']} s on {s['device']}) -> {args.out}")
    return 0


def in_results(*parts: str) -> Path:
    """The project's results folder (``project.layout().results``: ``figures/`` here), or ``parts`` under it, as a
    default the commands print: relative to the working folder when inside it, else absolute."""
    path = layout().results.joinpath(*parts)
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def _add_runs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the stored runs under folders and whether their code is current",
                       description="Scans run folders, summary files and study records (every layout stored under "
                                   "figures/) and reports each one's status: current (every semantic unit it "
                                   "recorded is at the version it recorded), stale (a unit's version was bumped or "
                                   "its checkpoint changed since: rerun grids with FTTA_RERUN_STALE=1, or "
                                   "`reproduce` it), uncertified (today's implementation of a unit it recorded is "
                                   "not certified: `units certify`), unrecorded (stored before code records), "
                                   "unfinished, unreadable, damaged (a file does not match the digest recorded for "
                                   "it), or, for a live record (a Flower run), running or interrupted (its server "
                                   "died: its heartbeat stopped).")
    p.add_argument("folders", nargs="*", type=Path, default=None,
                   help="run folders, summary files' folders (default: the project's results folder, figures/)")
    p.add_argument("--list", choices=["stale", "uncertified", "unfinished", "unreadable", "damaged", "running",
                                      "interrupted", "all"],
                   help="also list the runs with this status")
    p.add_argument("--migrate", action="store_true",
                   help="first rewrite former code records: one hash per module as definition records (reading "
                        "the modules' past sources from git), then current definition records as semantic unit "
                        "records (record_migration); prints what it did as JSON")
    p.set_defaults(func=cmd_runs)


def _add_units(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("units", help="the semantic units stored runs record: versions, certification, bumps",
                       description="Lists every semantic unit (ftta_core.units) with its version, whether today's "
                                   "implementation is certified in ftta_core/units.lock.json, and its oracle tests. "
                                   "certify NAME...: run each unit's oracle tests and, when they pass, certify "
                                   "today's implementation (stored runs stay current); --changed: every uncertified "
                                   "unit. bump NAME: a change of meaning (version + 1): every stored run that "
                                   "recorded the unit turns stale.")
    p.add_argument("action", nargs="?", choices=["list", "check", "certify", "bump"], default="list")
    p.add_argument("names", nargs="*", help="units (certify, bump)")
    p.add_argument("--changed", action="store_true", help="certify: every unit whose implementation is not certified")
    p.set_defaults(func=cmd_units)


def cmd_units(args: argparse.Namespace) -> int:
    from . import units

    try:
        if args.action == "list":
            import pandas as pd

            print(pd.DataFrame(units.status_table()).to_string(index=False))
            return 0
        if args.action == "check":
            missing = units.uncertified()
            print("every unit's implementation is certified" if not missing else
                  f"not certified: {', '.join(missing)} (python -m ftta_core units certify --changed, or bump)")
            return 1 if missing else 0
        if args.action == "certify":
            names = units.uncertified() if args.changed else args.names
            if not names:
                print("nothing to certify")
                return 0
            tests = sorted({t for name in names for t in units.oracles_of(name)})
            print(f"{', '.join(names)}: running their oracles ({' '.join(tests)}) ...", flush=True)
            added = units.certify(names)
            for name in names:
                print(f"{name}: certified {added[name]}" if name in added else f"{name}: already certified")
            return 0
        if not args.names:
            print("error: units bump needs the names of the units whose meaning changed", file=sys.stderr)
            return 2
        for name in args.names:
            print(f"{name}: version {units.bump(name)} (stored runs that recorded it are now stale)")
        return 0
    except units.UnitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _refused(paths: Sequence[Path], usable, what: str) -> bool:
    """Whether any of ``paths`` is not ``usable`` (then one line on stderr names them as not ``what``)."""
    missing = [str(p) for p in paths if not usable(p)]
    if missing:
        print(f"error: not {what}: {', '.join(missing)}", file=sys.stderr)
    return bool(missing)


def cmd_runs(args: argparse.Namespace) -> int:
    from .runstore import scan_table

    args.folders = args.folders or [in_results()]
    if _refused(args.folders, Path.is_dir, "a folder"):
        return 2
    if args.migrate:
        from .record_migration import migrate

        print(json.dumps(migrate(list(args.folders))))
    table = scan_table(args.folders)
    if table.empty:
        print("no stored runs")
        return 0
    print(table.groupby(["layout", "status"]).size().rename("runs").to_string())
    if args.list:
        shown = table if args.list == "all" else table[table.status == args.list]
        print(shown.to_string(index=False) if len(shown) else f"no {args.list} runs")
    return 0


def _add_reproduce(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reproduce", help="run stored runs again and mark them current if every number agrees",
                       description=" ".join((cmd_reproduce.__doc__ or "").split()))
    p.add_argument("summaries", nargs="+", type=Path, help="stored summary files (e.g. figures/fedtsa_table1/runs/X.json)")
    p.add_argument("--atol", type=float, default=0.0, help="largest difference of a number that still agrees "
                                                            "(default 0: exactly)")
    p.add_argument("--device", help="run on this device instead of the recorded one")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a run-plan worker)")
    p.add_argument("--check", action="store_true", help="compare only: never rewrite a summary")
    p.add_argument("--replace", action="store_true",
                   help="when a number differs, store today's run in the old one's place (a 'remade' note keeps the "
                        "former accuracies and how many numbers moved) instead of leaving the file stale")
    p.add_argument("--workers", type=int, default=1, help="runs at once, each in its own process with --threads "
                                                          "threads (default 1: one after the other, here)")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Runs each stored summary file's config again with today's code (one at a time, or --workers at once) and
    compares everything it measured (accuracies per domain and class, uploads, W's shares). When all agree, the
    file's code record becomes today's and a 'reproduced' note says when, on which device and from which former
    record: the run counts as current again. When anything differs the file is left as it is and the differences are
    printed, or with --replace today's run takes its place ('remade'). An interrupted run resumes on the next call.
    Exit status 1 if any run differs and was not remade."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    from .plan_runner import _init_worker
    from .workbook import reproduce

    if _refused(args.summaries, Path.is_file, "a stored summary file"):
        return 2
    if args.workers < 1:
        print("reproduce: --workers must be >= 1", file=sys.stderr)
        return 2
    one = functools.partial(reproduce, atol=args.atol, device=args.device, update=not args.check,
                            replace=args.replace)
    failed = 0

    def report(result: Dict[str, Any]) -> None:
        nonlocal failed
        failed += result["status"] == "differs"
        print(json.dumps(result), flush=True)

    if args.workers == 1:
        _init_worker(args.threads)
        for path in args.summaries:
            report(one(path))
    else:
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                 initargs=(args.threads,)) as pool:
            for future in as_completed([pool.submit(one, path) for path in args.summaries]):
                report(future.result())
    return 1 if failed else 0


def _add_train(sub: argparse._SubParsersAction) -> None:
    from .training import SOURCE_MODELS

    p = sub.add_parser("train-source", help="train a source model and write its checkpoint and card",
                       description="Train one of the shipped source models reproducibly; writes "
                                   "data/checkpoints/NAME.pt and NAME.json (clean and corrupted accuracy).")
    p.add_argument("--model", required=True, choices=sorted(SOURCE_MODELS))
    p.add_argument("--epochs", type=int, help="override the spec's epoch budget")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--out-dir", type=Path, help="checkpoint folder (default data/checkpoints)")
    p.add_argument("--name", help="store the model under this name: a variant of --model's recipe (e.g. with "
                                  "--epochs), its card's command retrains it")
    p.add_argument("--train-images", type=int, help="train on the first N images of the training split only (a "
                                                    "weaker model of the same recipe; needs --name)")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    import numpy as np

    from .data import load_dataset
    from .evaluation import source_metrics
    from .experiment import resolve_device
    from .training import CHECKPOINT_DIR, SOURCE_MODELS, SOURCE_TRAIN_IMAGES, save_checkpoint, source_card, train_model

    spec = SOURCE_MODELS[args.model]
    if args.name:
        variant = dataclasses.replace(spec, name=args.name, epochs=args.epochs or spec.epochs)
        if args.name in SOURCE_MODELS and args.name != args.model and (
                SOURCE_MODELS[args.name] != variant or SOURCE_TRAIN_IMAGES.get(args.name) != args.train_images):
            print(f"error: --name {args.name} is a shipped model of another recipe; retrain it with "
                  f"--model {args.name}", file=sys.stderr)
            return 2
        spec = variant
    elif args.train_images is not None and args.train_images != SOURCE_TRAIN_IMAGES.get(args.model):
        print("error: --train-images needs --name (it would replace the shipped model)", file=sys.stderr)
        return 2
    else:
        args.train_images = SOURCE_TRAIN_IMAGES.get(args.model)
    device = resolve_device(args.device)
    train = load_dataset(spec.dataset, "train", **spec.dataset_kwargs)
    test = load_dataset(spec.dataset, "test", **spec.dataset_kwargs)
    if args.train_images is not None:
        if not 0 < args.train_images <= len(train):
            raise ValueError(f"--train-images must be in 1..{len(train)}, got {args.train_images}")
        train = train.subset(np.arange(args.train_images))
    t0 = time.perf_counter()
    model = train_model(spec, train, seed=args.seed, device=device, epochs=args.epochs)
    wall = time.perf_counter() - t0
    command = this_command()
    metrics = {"epochs": args.epochs or spec.epochs, "train_images": len(train), "device": device,
               **source_metrics(model, test, device=device)}
    path = save_checkpoint(model, spec, source_card(spec, args.seed, command, wall, metrics),
                           args.out_dir or CHECKPOINT_DIR)
    print(json.dumps(metrics, indent=2))
    print(f"wrote {path}")
    return 0


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval-source", help="clean and per-corruption accuracy of a committed source model",
                       description="Evaluate a source checkpoint without adaptation on the clean test set "
                                   "and on every corruption at one severity.")
    p.add_argument("--model", required=True)
    p.add_argument("--severity", type=int, default=5)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from .data import load_dataset
    from .evaluation import source_metrics
    from .experiment import resolve_device
    from .training import SOURCE_MODELS, load_source_model

    if args.model not in SOURCE_MODELS:
        print(f"error: unknown model {args.model!r}; valid: {sorted(SOURCE_MODELS)}", file=sys.stderr)
        return 2
    spec = SOURCE_MODELS[args.model]
    device = resolve_device(args.device)
    test = load_dataset(spec.dataset, "test", **spec.dataset_kwargs)
    metrics = source_metrics(load_source_model(args.model, device=device), test, args.severity, device=device)
    print(json.dumps(metrics, indent=2))
    return 0


def _add_cards(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cards", help="render data/checkpoints/README.md from the model cards",
                       description="Write a markdown overview of every source-model card (JSON) in the checkpoint "
                                   "folder to README.md there.")
    p.add_argument("--dir", type=Path, default=None, help="checkpoint folder (default data/checkpoints)")
    p.set_defaults(func=cmd_cards)


def cmd_cards(args: argparse.Namespace) -> int:
    from .training import CHECKPOINT_DIR, render_cards

    directory = args.dir or CHECKPOINT_DIR
    (directory / "README.md").write_text(render_cards(directory))
    print(f"wrote {directory / 'README.md'}")
    return 0


def _add_gallery(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gallery", help="draw one CIFAR-10 image under all corruptions and severities")
    p.add_argument("--out", type=Path, default=None,
                   help="the image (default: corruption_gallery.png in the project's results folder, figures/)")
    p.add_argument("--index", type=int, default=None, help="CIFAR-10 test image index")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_gallery)


def cmd_gallery(args: argparse.Namespace) -> int:
    from .plots_gallery import write_gallery

    kwargs = {} if args.index is None else {"index": args.index}
    out = args.out or in_results("corruption_gallery.png")
    write_gallery(out, seed=args.seed, **kwargs)
    print(f"wrote {out}")
    return 0


def _add_notebooks(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("notebooks", help="execute notebooks headlessly with papermill",
                       description="Execute all notebooks (or the named ones) with papermill. The executed copies "
                                   "and the figures/tables they write go to an output folder (--out-dir, default "
                                   "runs/notebooks/<stamp>/; figures under <out>/figures/): nothing tracked is "
                                   "written. --in-place regenerates the committed notebooks and figures/ (full runs "
                                   "only; a notebook is replaced only when its execution succeeded). --smoke runs the "
                                   "fast CI mode; without it the notebook's own smoke default (or -p smoke=...) holds.")
    p.add_argument("names", nargs="*", help="notebook names or stems (default: all in notebooks/)")
    p.add_argument("--smoke", action="store_true", help="inject smoke=True (absent: -p smoke=... or the default)")
    p.add_argument("-p", "--parameter", action="append", metavar="K=V", help="papermill parameter (repeatable)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out-dir", type=Path, default=None,
                       help="where executed copies and their figures go (default: runs/notebooks/<stamp>/)")
    where.add_argument("--in-place", action="store_true",
                       help="rewrite the committed notebooks/*.ipynb and figures/ (refused for smoke runs)")
    p.add_argument("--show", action="store_true", help="print each executed notebook's tables and printed text")
    p.set_defaults(func=cmd_notebooks)


def cmd_notebooks(args: argparse.Namespace) -> int:
    from .notebooks import NotebookFailed, execute_notebooks, text_outputs

    def report(path: Path) -> None:
        if args.show:
            print("\n\n".join(text_outputs(path)))
        print(f"executed {path}", flush=True)

    params = key_values(args.parameter, "--parameter")
    try:
        execute_notebooks(args.names, smoke=True if args.smoke else None, parameters=params, out_dir=args.out_dir,
                          in_place=args.in_place, on_done=report)
    except ValueError as e:  # refused before anything ran (--in-place with smoke, unknown notebook, ...)
        raise SystemExit(f"notebooks: {e}")
    except NotebookFailed as e:
        print(f"notebooks: {e} (committed notebook untouched)", file=sys.stderr)
        return 1
    return 0


def _add_run_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run-plan", help="run the jobs planned with FTTA_PLAN=FILE, several processes at a time",
                       description="A notebook or `study fedtsa table` run with FTTA_PLAN=FILE runs nothing and appends the "
                                   "runs it lacks to FILE. This command runs them, --workers at a time (processes "
                                   "sharing one GPU, or one per CPU core), storing each summary where the grid "
                                   "looks for it; re-run the notebook or table to read them back.")
    p.add_argument("plan", type=Path, nargs="+",
                   help="the plan file (JSON lines); several: one queue in the order given, a job planned in two "
                        "files run once")
    p.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: CPU cores / workers)")
    p.add_argument("--deadline-s", type=float, dest="deadline_s",
                   help="start no job after this many seconds (running ones finish)")
    p.add_argument("--retries", type=int, default=1,
                   help="times a job whose worker process died (killed, out of memory) is run again, the other jobs "
                        "going on (default 1; with --ray: task retries); a job failing after that is reported at "
                        "the end and the command exits 1")
    p.add_argument("--pending", action="store_true",
                   help="run nothing: print each job that still has runs to make (one line each) and the total")
    from .ray_plan import add_ray_option

    add_ray_option(p)  # --ray ADDRESS, --ray-gpus F
    p.set_defaults(func=cmd_run_plan)


def _print_pending(jobs: Sequence[Any]) -> int:
    """``run-plan --pending``: the jobs with runs still to make (stored runs made by changed code count only under
    ``FTTA_RERUN_STALE``), one line each, and the total."""
    from .plan_runner import pending_runs

    total = 0
    for job in jobs:
        n = pending_runs(job)
        if n:
            c = job.config
            params = ",".join(f"{k}={v}" for k, v in {**c.get("local_params", {}), **c.get("strategy_params", {})}.items())
            print(f"{n} run(s): {c['local']}/{c['scenario']}/{'+'.join(job.strategies) or c['strategy']}"
                  f"{' ' + params if params else ''} seed {c['seed']}" + (f" alpha {c['label_alpha']}"
                                                                          if c.get("label_alpha") is not None else ""))
            total += n
    print(f"{total} run(s) pending in {len(jobs)} jobs")
    return 0


def cmd_run_plan(args: argparse.Namespace) -> int:
    from .plan import read_plans
    from .ray_plan import plan_executor

    for plan in args.plan:
        if not plan.is_file():
            raise SystemExit(f"plan file '{plan}' does not exist (make one with FTTA_PLAN={plan} ...)")
    jobs = read_plans(args.plan)
    if args.pending:
        return _print_pending(jobs)
    if args.retries < 0:
        print(f"error: --retries must be >= 0, got {args.retries}", file=sys.stderr)
        return 2
    where = f"Ray cluster {args.ray}" if args.ray else f"{args.workers} workers"
    print(f"{len(jobs)} planned jobs, {where}", flush=True)
    done = plan_executor(args)(jobs, workers=args.workers, deadline_s=args.deadline_s, threads=args.threads,
                               log=functools.partial(print, flush=True), retries=args.retries)
    errors = [d for d in done if "error" in d]
    skipped = sum(1 for d in done if d.get("skipped"))
    elsewhere = sum(1 for d in done if "elsewhere" in d)
    retried = sum(1 for d in done if d.get("attempts", 1) > 1 and "error" not in d)
    print(f"ran {sum(d['runs'] for d in done)} runs; {skipped} jobs skipped at the deadline; {retried} finished "
          f"after a retry; {elsewhere} left to another process running them; {len(errors)} failed")
    for d in errors:  # the failed jobs, last: re-running the command runs them again
        print(f"failed: {d['job']}: {d['error']}")
    return 1 if errors else 0


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-command per task."""
    parser = argparse.ArgumentParser(prog="python -m ftta_core", description="ftta: federated test-time adaptation "
                                     "workbook. Every command has --help.")
    # CommandParser: a command's config options (cli_config) are generated when it is used, after its plugins load
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    for add in (_add_run, _add_runs, _add_units, _add_train, _add_eval, _add_cards, _add_gallery, _add_notebooks,
                _add_run_plan, _add_reproduce):
        add(sub)
    from .study_registry import add_study_parsers

    add_study_parsers(sub, CommandParser)  # `study PAPER ACTION`: the studies registered by ftta.studies entry points
    from .plugins import add_plugin_argument

    for name in PLUGIN_COMMANDS:
        add_plugin_argument(sub.choices[name])
    return parser


# the commands that build runs take --plugin MODULE_OR_FILE (repeatable): methods registered by it (ftta_core.plugins)
PLUGIN_COMMANDS = ("run", "run-plan", "reproduce", "notebooks", "study")


DEBUG_ENV = "FTTA_DEBUG"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point. A config or data error (``ValueError``, a missing file, a missing key, bad YAML) ends as one
    line on stderr and exit status 2; with ``FTTA_DEBUG=1`` it is raised with its traceback."""
    global _ARGV
    _ARGV = None if argv is None else [str(a) for a in argv]
    from .allocator import keep_freed_memory

    keep_freed_memory()  # a step's large tensors reuse the memory the last step freed (ftta_core/allocator.py)
    try:
        args = build_parser().parse_args(argv)  # a plugin named by --plugin is loaded here (its methods are listed in --help)
        if args.command in PLUGIN_COMMANDS:  # --plugin, $FTTA_PLUGINS, entry points; --plugin exported to children
            from .plugins import use_plugins

            use_plugins(args.plugin)
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, KeyError, yaml.YAMLError) as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        if isinstance(exc, KeyError):
            text = f"missing key {exc.args[0]!r}" if exc.args else "KeyError"
        elif isinstance(exc, yaml.YAMLError):
            text = f"invalid YAML: {_yaml_problem(exc)}"
        else:
            text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"error: {text} ({DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)
        return 2
