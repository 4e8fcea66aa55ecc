"""The files a command reads, which none of its outputs may be (`files.check_not_input`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from shardsim.core.files import input_files

if TYPE_CHECKING:
    from shardsim.config.schema import RunConfig


def config_inputs(ns: argparse.Namespace, cfg: RunConfig, *more: object) -> list[Path]:
    """The files a command's configuration was read from: its file (the `config` argument) and
    the workload, topology, profile and calibration it names by path; and `more` that are files
    (other flags' paths)."""
    return input_files(ns.config, cfg.workload, cfg.topology, cfg.profile, cfg.calibration, *more)
