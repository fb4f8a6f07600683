"""Command-line options generated from ``ExperimentConfig``'s fields, so that none is missing or drifts.

Every field ``some_name`` is an option ``--some-name``: its type from the field's annotation (``Optional[X]`` also
takes ``none``), a ``bool`` as ``--smoke/--no-smoke``, a parameter mapping ``x_params`` as ``--x-param K=V``
(repeatable, YAML values). Names from a registry -- datasets, scenarios, severities, backends, source models, local
methods and strategies, plugins' included -- are listed in the option's help (the config refuses any other, in one
line). The help strings are ``FIELD_HELP`` below, keyed by field name (``tests/test_cli_config.py`` fails when a
field has none).

Building the parser stays light (no torch): a command's config options are added by ``CommandParser`` when the
command is first parsed or its help shown, after the plugins named by its ``--plugin`` options are loaded, so that
their methods are listed.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

# one line per ExperimentConfig field: the option's help (a test checks that every field has one)
FIELD_HELP: Dict[str, str] = {
    "dataset": "data set the clients' test streams are drawn from",
    "scenario": "who sees which corruption when: FedTSA's and FedCTTA's NIID/IID maps, the 10-client case studies, "
                "or 'heterogeneity' (set by --sh and --th)",
    "corruptions": "comma-separated corruption names ('clean' for none), or 'all' (the 15 of CIFAR-10-C, in order)",
    "severity": "corruption severity",
    "clients": "number of clients",
    "batch_size": "images per client per step",
    "images_per_client": "images in each client's pool; a corruption slot is images_per_client / batch_size steps "
                         "unless --slot-steps",
    "sh": "spatial heterogeneity (clusters / clients; scenario 'heterogeneity')",
    "th": "temporal heterogeneity (slot length / stream length; scenario 'heterogeneity')",
    "n_steps": "stream length in steps (scenario 'heterogeneity'; default: corruptions x images_per_client / "
               "batch_size)",
    "slot_steps": "steps per corruption slot (default images_per_client / batch_size)",
    "label_alpha": "Dirichlet label skew per client (none: IID labels)",
    "local": "local TTA method",
    "local_params": "a parameter of the local method (repeatable; added to the config's local_params)",
    "strategy": "server strategy (computes the collaboration matrix W)",
    "strategy_params": "a parameter of the strategy (repeatable; added to the config's strategy_params)",
    "model": "source model (default: the dataset's)",
    "seed": "seed of every random draw (stream, methods, participation)",
    "backend": "client bank: vectorized (all clients as one batched model) or loop (one model per client, the "
               "specification)",
    "device": "auto | cpu | cuda[:k]",
    "max_steps": "stop after this many steps (truncates the stream: smoke runs)",
    "smoke": "a few steps only",
    "participation": "probability that a client reports at a step (an absent client keeps its own model)",
    "robust_mixing": "mix each row of W by a robust statistic instead of the weighted mean (W unchanged): 'off', "
                     "'median' (weighted median), 'trimmed[:BETA]' (weight BETA cut per side, default 0.1) or "
                     "'clip[:C]' (deviations from the source model clipped to C x their median norm, default 2); "
                     "docs/threat-model.md",
    "attack": "clients that lie in their uploads: 'none' or KIND:IDS, KIND one of bn_x5 (BN statistics x5), "
              "sign_flip (parameters negated), mean_shift (+5 x mean|x|), IDS comma-separated client ids, e.g. "
              "bn_x5:0,7; the summary adds accuracy_honest",
}

NONE_WORDS = ("none", "null")


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, plus floats written without a dot (``1e-4``, ``1E-5``, ``2e3``), which YAML 1.1 (and
    so PyYAML) reads as strings."""


YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def _mapping_without_duplicates(loader: YamlLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    """A YAML mapping, refusing a key given twice (PyYAML would silently keep the last value)."""
    seen: Dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (first at line {seen[key].line + 1})", mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error as one line: the problem and where it is."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return (getattr(err, "problem", None) or " ".join(str(err).split())) + where


def _parse_value(text: str) -> Any:
    """Parse a ``key=value`` right-hand side as a YAML scalar or list: ``3`` int, ``0.1``/``1e-4`` float,
    ``true`` bool, ``[1, 2]`` list, anything else a string."""
    return yaml.load(text, Loader=YamlLoader)


def key_values(items: Optional[List[str]], flag: str) -> Dict[str, Any]:
    """``["k=v", ...]`` (a repeatable ``flag``'s values) as ``{k: v}``, each value a YAML scalar or list; a malformed
    item exits naming ``flag``."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"{flag} expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = _parse_value(v)
        except yaml.YAMLError as err:
            raise SystemExit(f"{flag} {item!r}: the value is not valid YAML ({_yaml_problem(err)})") from None
    return out


def config_class() -> type:
    """``ExperimentConfig`` (imported when asked for: it imports torch)."""
    from .experiment import ExperimentConfig

    return ExperimentConfig


def registry_choices() -> Dict[str, List[str]]:
    """The valid names of the config fields read from a registry, plugins' methods included (load plugins first)."""
    from .corruptions import SEVERITIES
    from .engine.bank import BACKENDS
    from .experiment import DATASET_DEFAULTS, SCENARIOS
    from .strategies import STRATEGIES
    from .training import SOURCE_MODELS
    from .tta import LOCAL_METHODS

    return {"dataset": sorted(DATASET_DEFAULTS), "scenario": list(SCENARIOS), "severity": list(SEVERITIES),
            "backend": sorted(BACKENDS), "model": sorted(SOURCE_MODELS), "local": sorted(LOCAL_METHODS),
            "strategy": sorted(STRATEGIES)}


def flag(name: str) -> str:
    """The option of field ``name``: ``batch_size`` -> ``--batch-size``, a mapping ``local_params`` ->
    ``--local-param`` (one K=V each)."""
    stem = name[:-len("_params")] + "_param" if name.endswith("_params") else name
    return "--" + stem.replace("_", "-")


def _unwrap_optional(hint: Any) -> Tuple[Any, bool]:
    """``Optional[X]`` -> ``(X, True)``; anything else ``(hint, False)``."""
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _scalar(kind: type, optional: bool) -> Callable[[str], Any]:
    """An argparse ``type`` for ``kind`` (``int``/``float``/``str``); for an optional field ``none`` is None."""
    def convert(text: str) -> Any:
        if optional and text.strip().lower() in NONE_WORDS:
            return None
        return kind(text)

    convert.__name__ = kind.__name__  # argparse names it in "invalid int value: 'x'"
    return convert


def add_config_options(parser: argparse.ArgumentParser, config: Optional[type] = None,
                       fields: Optional[Sequence[str]] = None, defaults: Optional[Mapping[str, Any]] = None,
                       choices: Optional[Mapping[str, Sequence[Any]]] = None,
                       help_text: Optional[Mapping[str, str]] = None, title: Optional[str] = None) -> None:
    """Add one option per field of dataclass ``config`` (default ``ExperimentConfig``; only ``fields`` if given) to
    ``parser``, in an argument group ``title``.

    Without ``defaults`` an option left out is absent from the parsed namespace (``config_values`` then takes only
    what was given: the config's own default or a config file holds); with ``defaults`` every listed scalar field is
    set (its default there, else the dataclass's). ``choices`` (default: ``registry_choices()``) are listed in the
    help; the config refuses a name outside them."""
    config = config or config_class()
    hints = typing.get_type_hints(config)
    choices = registry_choices() if choices is None else choices
    help_text = FIELD_HELP if help_text is None else help_text
    target = parser.add_argument_group(title) if title else parser
    known = {f.name: f for f in dataclasses.fields(config)}
    unknown = sorted(set(fields or ()) - set(known))
    if unknown:
        raise ValueError(f"not fields of {config.__name__}: {unknown}")
    for name in fields or list(known):
        f = known[name]
        kind, optional = _unwrap_optional(hints[name])
        is_mapping = typing.get_origin(kind) in (dict, Mapping, typing.get_origin(Mapping[str, Any])) or kind is dict
        text = [help_text.get(name, "").replace("%", "%%")]
        if name in choices:  # listed, not enforced here: the config refuses an unknown name in one line
            text.append("one of: " + ", ".join(map(str, choices[name])))
        if optional and kind is not bool:
            text.append("or 'none'")
        kw: Dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if defaults is not None and not is_mapping:
            kw["default"] = defaults[name] if name in defaults else (
                f.default if f.default is not dataclasses.MISSING else f.default_factory())  # type: ignore[misc]
            if kind is not bool:  # BooleanOptionalAction says its default itself
                text.append("default: %(default)s")
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif is_mapping:
            kw.update(action="append", metavar="K=V")
        else:  # int, float, str; a union such as 'Sequence[str] | str' (corruptions) as text, the config parses it
            kw.update(type=_scalar(kind if kind in (int, float) else str, optional), metavar=name.upper())
        target.add_argument(flag(name), help="; ".join(t for t in text if t), **kw)


def config_values(args: argparse.Namespace, config: Optional[type] = None) -> Dict[str, Any]:
    """The config fields given on the command line (``add_config_options`` without defaults): scalars as parsed,
    ``--x-param K=V`` options as a mapping ``{K: V}`` (to be merged into the config's ``x_params``)."""
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(config or config_class()):
        if not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        is_pairs = isinstance(value, list) and all(isinstance(v, str) for v in value) and f.name.endswith("_params")
        out[f.name] = key_values(value, flag(f.name)) if is_pairs else value
    return out


def merge_config(data: Dict[str, Any], given: Mapping[str, Any]) -> Dict[str, Any]:
    """``data`` (a config file's fields) overridden by the command line's ``given`` (``config_values``); parameter
    mappings are merged key by key. A file whose parameter field is not a mapping raises ``ValueError``."""
    out = dict(data)
    for key, value in given.items():
        if key.endswith("_params") and isinstance(value, dict):
            if not isinstance(out.get(key, {}), dict):
                raise ValueError(f"config field {key!r}: must be a mapping of parameter names to values, got "
                                 f"{out[key]!r}; {flag(key)} cannot add to it")
            out[key] = {**out.get(key, {}), **value}
        else:
            out[key] = value
    return out


def _plugin_specs(argv: Optional[Sequence[str]]) -> List[str]:
    """The values of the ``--plugin SPEC`` / ``--plugin=SPEC`` options in ``argv`` (nothing else is read)."""
    argv, specs = list(argv or []), []
    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv):
            specs.append(argv[i + 1])
        elif arg.startswith("--plugin="):
            specs.append(arg.split("=", 1)[1])
    return specs


class CommandParser(argparse.ArgumentParser):
    """An ``argparse`` parser with options added late (``defer``): on the first parse or help, after loading the
    plugins its command line names (``--plugin``; also ``$FTTA_PLUGINS`` and entry points), so that the choices
    listed from the registries include the plugins' methods. A plugin that fails to load raises ``PluginError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: List[Callable[[argparse.ArgumentParser], None]] = []

    def defer(self, add: Callable[[argparse.ArgumentParser], None]) -> None:
        """Call ``add(self)`` before this parser is first used."""
        self._deferred.append(add)

    def complete(self, argv: Optional[Sequence[str]] = None) -> "CommandParser":
        """Load the plugins named in ``argv``, then add the deferred options (once)."""
        if self._deferred:
            from .plugins import load_plugins

            load_plugins(_plugin_specs(argv))
            adds, self._deferred = self._deferred, []
            for add in adds:
                add(self)
        return self

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> Any:
        import sys

        self.complete(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.complete()
        return super().format_help()

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()
