"""Command-line flags generated from the configuration tree (`schema.SETTINGS`, derived from the
models' fields): a flag per setting, and the sweep's list flags of the settings it spans."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shardsim.config.load import load_config
from shardsim.config.schema import ALGOS, AXES, FIELDS, SETTINGS, FlatSetting, RunConfig, fraction_value
from shardsim.core.errors import ConfigError
from shardsim.core.flagtypes import Count, CountList, Real, list_items
from shardsim.specs.bounds import MAX_MOE_FACTOR

BY_NAME = {s.name: s for s in SETTINGS}


def setting_type(name: str) -> Count:
    """The flag type of an integer setting: its bound (the model's constraint), checked as it is parsed."""
    s = BY_NAME[name]
    return Count(s.maximum, s.minimum)


def setting_list(name: str) -> CountList:
    """The flag type of a list of an integer setting's values (the sweep's)."""
    s = BY_NAME[name]
    return CountList(s.maximum, s.minimum)


def choice_list(choices: tuple[str, ...], aliases: dict[str, str] | None = None) -> Callable[[str], tuple[str, ...]]:
    """A parser of comma-separated values, each one of `choices` or of their `aliases` (read as
    the choice it stands for)."""
    aliases = aliases or {}

    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(aliases.get(v, v) for v in list_items(text))
        bad = [v for v in vals if v not in choices]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(choices)}, got {text!r}")
        return tuple(dict.fromkeys(vals))

    return parse


def _alias_reader(aliases: dict[str, str]) -> Callable[[str], str]:
    """A flag's type that reads an alias as the choice it stands for (argparse then checks the choice)."""

    def choice(text: str) -> str:
        return aliases.get(text, text)

    return choice


def aliases_text(s: FlatSetting) -> str:
    """``; also fsdp (= zero), hsdp (= zero2d)``: the other names a setting's flag takes ("" where none)."""
    if not s.aliases:
        return ""
    return "; also " + ", ".join(f"{alias} (= {name})" for alias, name in s.aliases)


def choices_metavar(choices: tuple[str, ...] | None) -> str | None:
    """The choices as they are typed, where one holds a comma itself (``{pp,dp,tp | pp,tp,dp}``:
    argparse's ``{a,b}`` would read as more choices); None elsewhere (argparse's own)."""
    if not choices or not any("," in c for c in choices):
        return None
    return "{" + " | ".join(choices) + "}"


def str_list(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(list_items(text)))


def bool_list(text: str) -> tuple[bool, ...]:
    """``true,false`` → (True, False); duplicates dropped, order kept."""
    words = {"true": True, "false": False}
    vals = tuple(x.lower() for x in list_items(text))
    if not vals or any(v not in words for v in vals):
        raise argparse.ArgumentTypeError(f"expected true and/or false, comma-separated, got {text!r}")
    return tuple(dict.fromkeys(words[v] for v in vals))


def _default_text(s: FlatSetting) -> str:
    if s.default_text is not None:
        return s.default_text
    value: Any = s.default
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def fraction(text: str) -> float:
    """A number in (0, 1] (``--mlm-fraction 0.15``)."""
    try:
        return fraction_value(text, None)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None


# the real-valued settings other than fractions, by name: what their flag reads
REALS = {
    "moe_imbalance": Real(1.0, MAX_MOE_FACTOR, inclusive=True),
    "moe_capacity": Real(0.0, MAX_MOE_FACTOR, inclusive=True),
}


def fraction_list(text: str) -> tuple[float, ...]:
    """``0.15,0.3`` → (0.15, 0.3): numbers in (0, 1], duplicates dropped, order kept."""
    return tuple(dict.fromkeys(fraction(v) for v in list_items(text)))


def list_type(s: FlatSetting) -> Callable[[str], tuple[Any, ...]]:
    """The parser of a comma-separated list of `s`'s values."""
    if s.kind is float and s.name in REALS:
        real = REALS[s.name]
        return lambda text: tuple(dict.fromkeys(real(v) for v in list_items(text)))
    if s.kind is float:
        return fraction_list
    if s.kind is int:
        return setting_list(s.name)
    if s.kind is bool:
        return bool_list
    return choice_list(s.choices, dict(s.aliases)) if s.choices else str_list


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
            kind = list_type(s)
            p.add_argument(s.option, dest=s.name, type=kind, metavar="LIST", help=f"{s.help}; comma-separated{default}")
        elif s.alone is not None:
            # the flag alone and its --no- form: the values of the switch it once was
            p.add_argument(s.option, dest=s.name, nargs="?", const=s.alone, choices=s.choices, help=s.help + default)
            no = f"= {s.option} {s.negated}"
            p.add_argument(f"--no-{s.option[2:]}", dest=s.name, action="store_const", const=s.negated, help=no)
        elif s.kind is bool:
            p.add_argument(
                s.option, dest=s.name, action=argparse.BooleanOptionalAction, default=None, help=s.help + default
            )
        else:
            kind = setting_type(s.name) if s.kind is int else REALS.get(s.name, fraction) if s.kind is float else s.kind
            if s.aliases:
                kind = _alias_reader(dict(s.aliases))
            more = {"metavar": m} if (m := choices_metavar(s.choices)) else {}
            help_ = s.help + aliases_text(s) + default
            p.add_argument(s.option, dest=s.name, type=kind, choices=s.choices, help=help_, **more)


def add_axis_arguments(p: argparse.ArgumentParser, defaults: Mapping[str, str] | None = None) -> None:
    """The sweep's list flags, one per setting it spans (`Setting.axis`): ``--degrees 2,4`` (also
    spelled as the setting, ``--degree``), into the setting's name; a switch's ``--no-`` form
    and a flag alone give one value, as the setting's own flags do. `defaults`: what an axis's
    help says of its default where the sweep knows it (axis → text)."""
    defaults = defaults or {}
    for s in AXES:
        names = dict.fromkeys(("--" + s.axis.replace("_", "-"), s.option))
        extra: dict[str, Any] = {"nargs": "?", "const": (s.alone,)} if s.alone is not None else {}
        default = f" ({defaults[s.axis]})" if s.axis in defaults else ""
        help_ = (s.axis_help or "") + default + aliases_text(s)
        p.add_argument(*names, dest=s.name, type=list_type(s), metavar="LIST", help=help_, **extra)
        if s.kind is bool:
            no = f"= {s.option} false"
            p.add_argument(f"--no-{s.option[2:]}", dest=s.name, action="store_const", const=(False,), help=no)
        elif s.negated is not None:
            no = f"= {s.option} {s.negated}"
            p.add_argument(f"--no-{s.option[2:]}", dest=s.name, action="store_const", const=(s.negated,), help=no)


def overrides_from_args(ns: argparse.Namespace) -> dict[str, Any]:
    """The schema's settings given as flags (None where a flag was not given)."""
    return {k: getattr(ns, k, None) for k in FIELDS}


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    return load_config(ns.config, overrides_from_args(ns))


def add_algo_argument(p: argparse.ArgumentParser, *, auto: bool) -> None:
    """`--algo`: a collective algorithm; `auto` (predict, sweep) lets the simulator choose."""
    choices = ("auto", *ALGOS) if auto else ALGOS
    why = (
        " (auto: on NCCL what its tuner picks for the size, ranks and nodes, SageMaker MiCS's hierarchical"
        " all-gather across nodes under --library smp; ring on gloo)"
        if auto
        else ""
    )
    p.add_argument(
        "--algo", default=choices[0], choices=choices, help=f"collective algorithm{why} (default: {choices[0]})"
    )
