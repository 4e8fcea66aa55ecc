"""The files of a sweep: its table (CSV and Parquet) and its recommendation (JSON), written
atomically into an output folder checked before any prediction runs.

One folder holds one sweep. `sweep_folder` holds it for the whole sweep (a lock file,
`LOCK`, naming the holder): a second sweep into it is refused at once, before any prediction,
naming the first; so are a folder whose manifest is corrupt, a folder of files that has no
manifest (not a sweep's: unless forced) and a folder where the sweep would replace one of its
own inputs. `publish` makes the new files in a staging folder inside it, then removes the
files the earlier sweep's `MANIFEST` lists, moves the new ones in and writes the manifest: what
this sweep wrote and the command that wrote it. Files the manifest does not list are left as
they are; a sweep that fails before publishing leaves the earlier one's files whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.core.errors import ConfigError, CorruptFile, WriteError
from shardsim.core.files import atomic_path, atomic_write, check_not_input, install, output_folder
from shardsim.core.lockfile import Busy, held
from shardsim.core.yamlio import read_text
from shardsim.simulator.results import nest
from shardsim.sweep.rows import native

if TYPE_CHECKING:
    import pandas as pd


MANIFEST = "manifest.json"
LOCK = ".shardsim-sweep.lock"
STAGING = ".shardsim-sweep-new-"  # the prefix of the folder the files are made in before they are moved in


# the files a sweep writes besides its plots (*.png, *.svg) and the manifest
TABLES = ("sweep.csv", "sweep.parquet", "recommended.json", "report.html")
PLOTS = ("*.png", "*.svg")


@contextlib.contextmanager
def sweep_folder(out: str | Path, command: str, *, force: bool = False, inputs: Iterable[Path] = ()) -> Iterator[Path]:
    """`out` checked and made (`files.output_folder`) and held for the block by this process,
    running `command`, all before any prediction runs. ConfigError naming the holder when
    another sweep holds it; CorruptFile when its manifest is not one (`earlier_files`); ConfigError
    when it holds files and no manifest, unless `force` (not a sweep's folder: its files are
    the user's), or when one of the command's `inputs` is a file the sweep would replace."""
    with output_folder(out, "--out") as path, contextlib.ExitStack() as hold:
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            hold.enter_context(held(path / LOCK, f"pid {os.getpid()} ({command}) since {since}"))
        except Busy as exc:
            who = f"another sweep, {exc.holder}" if exc.holder else "another sweep"
            raise ConfigError(
                f"{out} is being written by {who}; wait for it to end or choose another --out", field="--out"
            ) from None
        _check_folder(path, force, inputs)
        yield path


def _check_folder(out: Path, force: bool, inputs: Iterable[Path]) -> None:
    """Refuse `out` before any prediction runs: a corrupt manifest, files without a manifest
    (unless `force`), an input among the files the sweep would write or remove."""
    earlier = earlier_files(out)
    if not earlier and not force:
        theirs = sorted(p.name for p in out.iterdir() if not (p.name == LOCK or p.name.startswith(STAGING)))
        if theirs:
            shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
            raise ConfigError(
                f"{out} holds files ({shown}) and no sweep manifest ({MANIFEST}): not a sweep's folder, whose files "
                "a sweep may replace; choose an empty or new folder, or --force to write into it",
                field="--out",
            )
    replaced = [out / n for n in (*earlier, *TABLES, MANIFEST)]
    replaced += [p for pattern in PLOTS for p in out.glob(pattern)]
    check_not_input(replaced, inputs, "--out")


def earlier_files(out: Path) -> list[str]:
    """The files the manifest in `out` lists (none without one); CorruptFile naming it when it
    is not a manifest or lists anything but a file name of the folder."""
    path = out / MANIFEST
    if not path.exists():
        return []
    try:
        doc = json.loads(read_text(path))  # bounded: a folder, a device or a huge file is named at once
    except ConfigError as exc:
        raise CorruptFile(f"not a sweep manifest ({exc.message}); move it aside", where=str(path)) from None
    except json.JSONDecodeError as exc:
        raise CorruptFile(f"not a sweep manifest ({exc}); move it aside", where=str(path)) from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise CorruptFile("not a sweep manifest: no list of files; move it aside", where=str(path))
    for name in files:
        if not isinstance(name, str) or name != Path(name).name or name.startswith(".") or name == MANIFEST:
            raise CorruptFile(f"{name!r} is not a file of this folder; move it aside", where=str(path), field="files")
    return [*files, out / MANIFEST]


def publish(out: Path, command: str, make: Callable[[Path], list[Path]]) -> list[Path]:
    """This sweep's files in `out` (which `sweep_folder` holds): `make` writes them into a
    staging folder it is given; then the files of `out`'s earlier manifest that this sweep does
    not write are removed, the new ones installed (as `files.atomic_path` writes: a link's target,
    a device written through) and the manifest written. Returns their paths in `out`, the
    manifest's last. A write that fails raises `WriteError` naming what was installed and what
    not; the manifest then lists what was."""
    earlier = earlier_files(out)  # a bad manifest is named before anything is made
    for stale in out.glob(f"{STAGING}*"):  # left by a sweep killed while making its files
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=out, prefix=STAGING))
    files: list[Path] = []
    try:
        try:
            made = make(stage)
        except WriteError as exc:  # nothing of this sweep is in `out`: the earlier files are whole
            raise WriteError(exc.errno, exc.strerror, str(out / Path(exc.filename).name), (), ("any file",)) from exc
        names = {p.name for p in made}
        for name in earlier:
            if name not in names:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    (out / name).unlink()
        for i, p in enumerate(made):
            try:
                install(p, out / p.name)
            except WriteError as exc:
                raise exc.naming([f.name for f in files], [q.name for q in made[i + 1 :]]) from exc
            files.append(out / p.name)
    except BaseException:
        if files:  # the manifest lists what this sweep did install
            with contextlib.suppress(OSError):
                _write_manifest(out, command, files)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    _write_manifest(out, command, files)
    return [*files, out / MANIFEST]


def _write_manifest(out: Path, command: str, files: list[Path]) -> None:
    manifest = {
        "command": command,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": [p.name for p in files],
    }
    atomic_write(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def write_tables(df: pd.DataFrame, out: str | Path, stem: str = "sweep") -> list[Path]:
    """All rows to CSV and Parquet."""
    out = Path(out)
    csv, parquet = out / f"{stem}.csv", out / f"{stem}.parquet"
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(parquet) as tmp:
        df.to_parquet(tmp, index=False)
    return [csv, parquet]


def write_recommendation(rec: dict[str, Any], out: str | Path, name: str = "recommended.json") -> Path:
    """`recommend()`'s answer as indented JSON."""
    path = Path(out) / name
    atomic_write(path, json.dumps(rec, indent=2) + "\n")
    return path


def to_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN → None, numpy scalars → Python), the key's `strategy_<field>`
    columns as one `strategy` object (`simulator.results.nest`)."""
    return [nest({k: native(v) for k, v in r.items()}) for r in df.to_dict(orient="records")]
