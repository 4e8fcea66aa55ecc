"""`shardsim workloads`: the model library, a line each (``--json``: an object each); with a FILE
(a Hugging Face config.json or a model YAML), that model described."""

from __future__ import annotations

import argparse
import json


def _params(n: float) -> str:
    """A parameter count as models are named: 334.1 M, 6.649 B."""
    from shardsim.core.units import format_count

    return format_count(n).replace(" G", " B")


def _library(as_json: bool) -> int:
    from shardsim.core.console import console
    from shardsim.core.tables import Column, Grid, layout, show
    from shardsim.core.units import format_count
    from shardsim.specs.model.blocks import from_arch
    from shardsim.specs.model.describe import summary
    from shardsim.specs.model.library import library

    rows = [
        summary(
            from_arch(name, m.arch),
            published=m.published_params,
            source=m.source,
            published_active=m.published_active,
            active_source=m.active_source,
        )
        for name, m in library().items()
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    g = Grid(
        None,
        [
            Column("model"),
            Column("family"),
            Column("params", figure=True),
            Column("layers", figure=True),
            Column("other blocks"),
            Column("FLOP/sample", figure=True),
            Column("published", figure=True),
        ],
    )
    for r in rows:
        published = _params(r["published_params"]) if r["published_params"] else ""
        flops = format_count(r["train_flops_per_sample"])
        g.add(
            r["model"],
            r["family"],
            _params(r["params"]),
            str(r["layers"]),
            ", ".join(r["other_blocks"]),
            flops,
            published,
        )
    out = console()
    show(out, layout(out, g))
    moe = [r for r in rows if "active_params" in r]
    if moe:
        m = Grid(
            "Mixtures of experts (active: the parameters a token uses)",
            [Column("model"), Column("experts", figure=True), Column("top-k", figure=True),
             Column("shared ffn", figure=True), Column("active", figure=True), Column("published", figure=True)],
        )  # fmt: skip
        for r in moe:
            published = _params(r["published_active_params"]) if r["published_active_params"] else ""
            m.add(
                r["model"],
                str(r["experts"]),
                str(r["top_k"]),
                str(r["shared_ffn"] or ""),
                _params(r["active_params"]),
                published,
            )
        show(out, layout(out, m))
    return 0


def _file(path: str, seq_len: int | None, as_json: bool) -> int:
    """One model file described: its shape, counts and (for a config.json) the sequence length read."""
    from shardsim.core.console import labelled, output_width
    from shardsim.core.errors import ConfigError
    from shardsim.core.units import format_count
    from shardsim.simulator.workload.resolve import load_workload
    from shardsim.specs.model.arch import Shape
    from shardsim.specs.model.describe import read_model_file, summary
    from shardsim.specs.model.hf_keys import DEFAULT_SEQ_LEN

    if not path.endswith((".json", ".yaml", ".yml")):
        raise ConfigError("expected a Hugging Face config.json or a model .yaml", field="FILE", where=path)
    w = load_workload(path, Shape(seq_len=seq_len))
    info = read_model_file(path)[1] if path.endswith((".yaml", ".yml")) else {}
    published, active = (
        v.get("value") if isinstance(v, dict) else v for v in (info.get("params"), info.get("active_params"))
    )
    active_info = info.get("active_params")
    active_source = active_info.get("source") if isinstance(active_info, dict) else None
    row = summary(
        w, published=published, source=info.get("source"), published_active=active, active_source=active_source
    )
    if as_json:
        print(json.dumps(row, indent=2))
        return 0
    width = output_width()
    print(f"{row['model']} ({row['family']}): {_params(row['params'])} parameters, {row['layers']} layers")
    if "active_params" in row:
        experts = f"{row['experts']} experts of ffn {row['expert_ffn']}, {row['top_k']} a token"
        shared = f", a shared expert of ffn {row['shared_ffn']}" if row["shared_ffn"] else ""
        text = f"{_params(row['active_params'])} parameters a token ({experts}{shared}; {row['moe_layers']} MoE layers)"
        print(labelled("active", text, width))
    shape = ", ".join(
        f"{k} {row[k]}" for k in ("hidden", "heads", "kv_heads", "ffn", "vocab", "image", "patch") if k in row
    )
    print(labelled("shape", shape + f", {row['positions']} positions", width))
    if "seq_len" in row:
        n = row["seq_len"]
        if seq_len:
            said = "--seq-len"
        elif not path.endswith(".json"):
            said = "the file's"
        elif n == DEFAULT_SEQ_LEN:
            said = "the default for a config.json, not its maximum positions; --seq-len to change"
        else:
            said = f"the model's maximum positions, fewer than the default {DEFAULT_SEQ_LEN:,}"
        text = f"{n:,} tokens per sample ({said})"
        print(labelled("sequence", text, width))
    print(
        labelled("FLOP/sample", f"{format_count(row['train_flops_per_sample'])} (training: forward + backward)", width)
    )
    if published:
        also = f", {_params(active)} active" if active else ""
        print(labelled("published", f"{_params(published)} parameters{also}", width))
    return 0


def _cmd_workloads(ns: argparse.Namespace) -> int:
    if ns.file is None:
        if ns.seq_len is not None:
            from shardsim.core.errors import ConfigError

            raise ConfigError("applies to a model FILE, not to the library list", field="seq_len")
        return _library(ns.json)
    return _file(ns.file, ns.seq_len, ns.json)


def register(sub) -> None:
    from shardsim.core.flagtypes import Count
    from shardsim.specs.bounds import MAX_SEQ_LEN

    w = sub.add_parser(
        "workloads",
        help="list the model library, or describe a model file",
        description="List the model library: family, parameters (and the published count; a mixture of experts "
        "also its active parameters, those a token uses), layers (transformer "
        "or MLP layers; a pipeline stage holds at least one), the other blocks (embedding, head), training FLOPs "
        "per sample. Each model's shape and sources: shardsim/data/models/*.yaml. With a FILE (a Hugging Face "
        "config.json or a model .yaml), describe that model; a config.json is read at 4,096 tokens per sample "
        "(or its maximum positions when fewer) unless --seq-len says otherwise.",
    )
    w.add_argument("file", nargs="?", metavar="FILE", help="a Hugging Face config.json or a model .yaml")
    w.add_argument(
        "--seq-len",
        type=Count(MAX_SEQ_LEN),
        default=None,
        help="tokens per sample, FILE only (default: a config.json's 4,096, or its maximum positions when fewer; a "
        ".yaml's own)",
    )
    w.add_argument("--json", action="store_true", help="print JSON (a list for the library, an object for FILE)")
    w.set_defaults(func=_cmd_workloads)
