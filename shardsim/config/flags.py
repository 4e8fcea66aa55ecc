"""Command-line flags generated from the configuration schema: each declared once, in `SETTINGS`."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from shardsim.config.load import load_config
from shardsim.config.schema import ALGOS, FIELDS, SETTINGS, STRATEGY_FIELDS, RunConfig, Setting
from shardsim.core.flagtypes import Count, CountList
from shardsim.simulator.scale import SETTING_BOUNDS
from shardsim.simulator.workload.arch import SHAPE_FIELDS

DEFAULTS = RunConfig()


def setting_type(name: str) -> Count:
    """The flag type of an integer setting: its bound (`scale.SETTING_BOUNDS`), checked as it is parsed."""
    b = SETTING_BOUNDS[name]
    return Count(b.maximum, b.minimum)


def setting_list(name: str) -> CountList:
    """The flag type of a list of an integer setting's values (the sweep's)."""
    b = SETTING_BOUNDS[name]
    return CountList(b.maximum, b.minimum)


def choice_list(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A parser of comma-separated values, each one of `choices`."""

    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in vals if v not in choices]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(choices)}, got {text!r}")
        return tuple(dict.fromkeys(vals))

    return parse


def str_list(text: str) -> tuple[str, ...]:
    vals = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not vals:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return vals


def _default_text(s: Setting) -> str:
    if s.name == "strategy":
        value: Any = DEFAULTS.strategy.kind
    elif s.name in STRATEGY_FIELDS:
        value = getattr(DEFAULTS.strategy, s.name)
    elif s.name in SHAPE_FIELDS:
        return "the workload's"
    else:
        value = getattr(DEFAULTS, s.name)
    if s.name == "nodes":
        return f"the file's, else {value} on the default topology, else the topology's own count"
    if s.name == "degree":
        return "the world for zero, 1 for pipeline; zero2d needs one"
    if s.name == "reduce_dtype":
        return "the precision"
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def add_config_arguments(
    p: argparse.ArgumentParser,
    *,
    exclude: Iterable[str] = (),
    listed: Iterable[str] = (),
    config_help: str = "YAML config file (flags override it)",
) -> None:
    """The `config` positional and one flag per schema setting, overriding the file's key.
    `listed` settings take a comma-separated list (the sweep's clusters); `exclude` leaves
    settings out (the sweep spans the strategy fields with lists of its own)."""
    skip, lists = set(exclude), set(listed)
    p.add_argument("config", nargs="?", help=config_help)
    for s in SETTINGS:
        if not s.flag or s.name in skip:
            continue
        default = f" (default: {_default_text(s)})"
        if s.name in lists:
            kind = setting_list(s.name) if s.kind is int else str_list
            p.add_argument(s.option, dest=s.name, type=kind, metavar="LIST", help=f"{s.help}; comma-separated{default}")
        elif s.name == "checkpointing":
            # --checkpointing alone is full and --no-checkpointing none, as when it was a switch
            p.add_argument(s.option, dest=s.name, nargs="?", const="full", choices=s.choices, help=s.help + default)
            no = "= --checkpointing none"
            p.add_argument("--no-checkpointing", dest=s.name, action="store_const", const="none", help=no)
        elif s.kind is bool:
            p.add_argument(
                s.option, dest=s.name, action=argparse.BooleanOptionalAction, default=None, help=s.help + default
            )
        else:
            kind = setting_type(s.name) if s.kind is int else s.kind
            p.add_argument(s.option, dest=s.name, type=kind, choices=s.choices, help=s.help + default)


def overrides_from_args(ns: argparse.Namespace) -> dict[str, Any]:
    """The schema's settings given as flags (None where a flag was not given)."""
    return {k: getattr(ns, k, None) for k in FIELDS}


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    return load_config(ns.config, overrides_from_args(ns))


def add_algo_argument(p: argparse.ArgumentParser, *, auto: bool) -> None:
    """`--algo`: a collective algorithm; `auto` (predict, sweep) lets the simulator choose."""
    choices = ("auto", *ALGOS) if auto else ALGOS
    why = (
        " (auto: hierarchical all-gather across nodes, ring or tree all-reduce across nodes by size"
        " as NCCL's tuner picks, ring otherwise)"
        if auto
        else ""
    )
    p.add_argument(
        "--algo", default=choices[0], choices=choices, help=f"collective algorithm{why} (default: {choices[0]})"
    )
