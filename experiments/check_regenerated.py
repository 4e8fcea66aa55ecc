"""Regenerate the seed predictions, every committed sweep and the GPU comparisons into a scratch
folder and compare them with the committed files: numbers within a relative 1e-12, text
identical. CI runs it (the README's test command): a committed figure that the code no longer
gives fails there, not in a unit test of its own.

    python experiments/check_regenerated.py            # all; exit 1 on any difference
    python experiments/check_regenerated.py --studies seed --keep /tmp/regen

Compared: experiments/seed/*.prediction.json and *.trace.json (from `shardsim predict` of each
*.yaml there); per study under experiments/sweeps/, sweep.csv, sweep.parquet,
recommended.json and summary.md; per scripted study (`SCRIPTED`: experiments/NAME/study.py
--out DIR), its table.json and README.md; and experiments/validation/gpu/compare-*.json and .md (from
compare.py of the profile-*.json beside them, on the topology and precision each names); and
the README's example of what `shardsim predict` prints at 80 columns.
Plots (PNG/SVG) are not compared: they are drawn from the same tables, and a matplotlib
upgrade changes their bytes without changing a number.

Committed files written before the result key (docs/results.md) are read in today's form first
(`upgrade_prediction`, `upgrade_table`; a recommendation's rows completed from the committed
sweep.parquet; summary.md's table headers renamed), so every number is still compared with
the one committed. The allocated and reserved peaks such a sweep.csv lacks are compared with
the committed sweep.parquet's parts, at the CSV's 6 significant digits.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pandas as pd

from shardsim.simulator.results import KEY_COLUMNS, RENAMED, nest, upgrade_prediction
from shardsim.sweep.rows import SETTING_COLUMNS, native, upgrade_table

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "experiments" / "seed"
SWEEPS = ROOT / "experiments" / "sweeps"
GPU = ROOT / "experiments" / "validation" / "gpu"
COMPARED = ("sweep.csv", "sweep.parquet", "recommended.json", "summary.md")
SCRIPTED = ("mixtral-8x7b", "deepseek-v3")  # experiments/NAME/study.py --out DIR writes table.json and README.md
SCRIPTED_FILES = ("table.json", "README.md")
RTOL = 1e-12
DERIVED = ("memory_allocated_gib", "memory_reserved_gib")  # not in a sweep.csv written before the result key


def shardsim() -> str:
    """The installed `shardsim` command of this interpreter's environment."""
    return str(Path(sys.executable).parent / "shardsim")


def same_json(a, b, where: str) -> list[str]:
    """Differences between two JSON values, numbers compared within RTOL."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys differ: {sorted(a.keys() ^ b.keys())}"]
        return [d for k in a for d in same_json(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items, committed {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in same_json(x, y, f"{where}[{i}]")]
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return [] if a == b else [f"{where}: {a!r} != committed {b!r}"]
    if math.isclose(a, b, rel_tol=RTOL, abs_tol=0.0) or (math.isnan(a) and math.isnan(b)):
        return []
    return [f"{where}: {a!r} != committed {b!r}"]


def same_frame(a: pd.DataFrame, b: pd.DataFrame, where: str) -> list[str]:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return [f"{where}: shape or columns differ"]
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=RTOL, atol=0.0, check_dtype=False)
    except AssertionError as exc:
        return [f"{where}: {str(exc).splitlines()[0]}"]
    return []


def committed_json(old: Path):
    """A committed JSON file in today's form (see the module docstring)."""
    doc = json.loads(old.read_text())
    if old.name.endswith(".prediction.json"):
        return upgrade_prediction(doc)
    if old.name.endswith(".trace.json"):
        other = doc["otherData"]
        return doc | {"otherData": other | {"prediction": upgrade_prediction(other["prediction"])}}
    if old.name == "recommended.json":
        return upgrade_recommendation(doc, committed_table(old.with_name("sweep.parquet")))
    return doc


def committed_table(path: Path) -> pd.DataFrame:
    return upgrade_table(pd.read_parquet(path))


def upgrade_recommendation(rec, table: pd.DataFrame):
    """A recommendation's rows in today's form: renamed as the table's columns, the key's strategy
    one object, the fields a row written before the key lacks taken from its row of `table`, the
    context-parallel degree of one written before it 1."""
    if isinstance(rec, list):
        return [upgrade_recommendation(r, table) for r in rec]
    if not isinstance(rec, dict):
        return rec
    if "config" not in rec:
        out = {k: upgrade_recommendation(v, table) for k, v in rec.items()}
        if isinstance(out.get("strategy"), dict) and "cp" not in out["strategy"]:  # written before context parallelism
            out["strategy"] = out["strategy"] | {"cp": 1}
        return out
    flat = {RENAMED.get(k, k): v for k, v in rec.items()}
    row = table[(table["topology"] == flat["topology"]) & (table["nodes"] == flat["nodes"])]
    row = row[row["label"] == flat["label"]].iloc[0]
    keep = [*KEY_COLUMNS, *(c for c in SETTING_COLUMNS if c in flat), "step_time_s", "samples_per_s"]
    keep += ["memory_allocated_gib", "memory_reserved_gib", "memory_required_gib", "fits"]
    keep += ["cost_per_million_samples_usd"]
    return nest({k: flat[k] if k in flat else native(row[k]) for k in keep})


def as_csv(df: pd.DataFrame) -> pd.DataFrame:
    """`df` written as a sweep's CSV is (`sweep.output.write_tables`) and read back."""
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.6g")
    buf.seek(0)
    return pd.read_csv(buf)


def compare_file(new: Path, old: Path) -> list[str]:
    where = str(old.relative_to(ROOT))
    if not new.exists():
        return [f"{where}: not regenerated"]
    if old.suffix == ".json":
        return same_json(json.loads(new.read_text()), committed_json(old), where)
    if old.suffix == ".csv":
        regenerated = pd.read_csv(new)
        committed = as_csv(upgrade_table(pd.read_csv(old)))  # read back as a CSV of today's columns is
        derived = [c for c in DERIVED if c not in pd.read_csv(old, nrows=0).columns]
        diffs = same_frame(regenerated.drop(columns=derived), committed.drop(columns=derived), where)
        if derived:  # at the CSV's precision, from the committed table's parts
            from_parts = as_csv(committed_table(old.with_suffix(".parquet"))[derived])
            diffs += same_frame(regenerated[derived], from_parts, f"{where} (from sweep.parquet)")
        return diffs
    if old.suffix == ".parquet":
        return same_frame(pd.read_parquet(new), committed_table(old), where)
    text = old.read_text()
    if old.name == "summary.md":  # the table headers of a summary written before the key
        text = text.replace("| rank | config |", "| rank | label |")
        text = text.replace("memory_per_rank_gib", "memory_required_gib")
    return [] if new.read_text() == text else [f"{where}: text differs"]


def check_seed(scratch: Path) -> list[str]:
    diffs = []
    for cfg in sorted(SEED.glob("*.yaml")):
        trace = scratch / f"{cfg.stem}.trace.json"
        out = subprocess.run([shardsim(), "predict", str(cfg), "--json", "--trace", str(trace)],
                             check=True, capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        (scratch / f"{cfg.stem}.prediction.json").write_text(out.stdout)
        for kind in ("prediction", "trace"):
            diffs += compare_file(scratch / f"{cfg.stem}.{kind}.json", SEED / f"{cfg.stem}.{kind}.json")
    return diffs


def check_sweeps(scratch: Path, studies: list[str]) -> list[str]:
    script = ROOT / "experiments" / "run_sweeps.py"
    subprocess.run([sys.executable, str(script), *studies, "--out", str(scratch)], check=True, cwd=ROOT)
    return [
        d
        for study in studies
        for name in COMPARED
        if (SWEEPS / study / name).exists()
        for d in compare_file(scratch / study / name, SWEEPS / study / name)
    ]


def check_scripted(scratch: Path, name: str) -> list[str]:
    """A scripted study (`SCRIPTED`) run into the scratch folder, against its committed files."""
    here = ROOT / "experiments" / name
    subprocess.run([sys.executable, str(here / "study.py"), "--out", str(scratch / name)],
                   check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    return [d for f in SCRIPTED_FILES for d in compare_file(scratch / name / f, here / f)]


def check_gpu(scratch: Path) -> list[str]:
    """compare.py of each committed GPU comparison's profile, against the committed table and figures."""
    diffs = []
    for old in sorted(GPU.glob("compare-*.json")):
        name = old.stem.removeprefix("compare-")
        model_of = json.loads(old.read_text())["total"]["model_of"]  # "p5.48xlarge (H100 SXM), bf16"
        topology, precision = model_of.split()[0], model_of.rsplit(", ", 1)[1]
        new = scratch / "gpu" / f"compare-{name}.md"
        new.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(GPU / "compare.py"), str(GPU / f"profile-{name}.json"),
                        "--topology", topology, "--precision", precision, "--out", str(new)],
                       check=True, capture_output=True, cwd=ROOT)  # fmt: skip
        diffs += compare_file(new.with_suffix(".json"), old) + compare_file(new, old.with_suffix(".md"))
    return diffs


def check_readme() -> list[str]:
    """The README's example output of `shardsim predict` (the seed at 80 columns), as printed today."""
    shown = re.search(r"`shardsim predict` prints.*?```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    if shown is None:
        return ["README.md: no example output of `shardsim predict`"]
    out = subprocess.run([shardsim(), "predict"], check=True, capture_output=True, text=True, cwd=ROOT,
                         env=os.environ | {"COLUMNS": "80"}).stdout  # fmt: skip
    return (
        [] if out == shown.group(1) else ["README.md: the predict example differs from what `shardsim predict` prints"]
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", default=None, help="comma-separated studies (default: every one committed)")
    p.add_argument("--keep", type=Path, default=None, help="regenerate into this folder and keep it")
    p.add_argument("--no-seed", action="store_true", help="skip the seed predictions")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU comparisons")
    p.add_argument("--no-scripted", action="store_true", help="skip the scripted studies (`SCRIPTED`)")
    ns = p.parse_args()
    committed = (d.name for d in SWEEPS.iterdir() if (d / "sweep.csv").exists())  # not a study's script alone
    studies = ns.studies.split(",") if ns.studies else sorted(committed)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = ns.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        checks = [
            *([] if ns.no_scripted else [partial(check_scripted, scratch, name) for name in SCRIPTED]),
            partial(check_sweeps, scratch, studies),
            *([] if ns.no_seed else [partial(check_seed, scratch)]),
            *([] if ns.no_gpu else [partial(check_gpu, scratch)]),
            check_readme,
        ]  # each runs its own processes: on every core at once, the longest first
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            diffs = [d for found in pool.map(lambda check: check(), checks) for d in found]
    for d in diffs:
        print(d)
    n_seed = 0 if ns.no_seed else len(list(SEED.glob("*.yaml")))
    n_gpu = 0 if ns.no_gpu else len(list(GPU.glob("compare-*.json")))
    verdict = f"{len(diffs)} differences" if diffs else "identical"
    n_scripted = 0 if ns.no_scripted else len(SCRIPTED)
    print(
        f"{n_seed} seed predictions, {len(studies)} sweeps, {n_scripted} scripted studies, {n_gpu} GPU comparisons, "
        f"the README: {verdict}"
    )
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
