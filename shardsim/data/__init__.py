"""The data shardsim ships, in one place: instance and cluster descriptions (``topologies/``, with
the fitted training figures in ``topologies/fitted/``), the model library (``models/``) and the
validation matrices (``matrices/``). Every figure in them carries its source."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

ROOT = Path(str(resources.files("shardsim.data")))
TOPOLOGIES = ROOT / "topologies"
MODELS = ROOT / "models"
MATRICES = ROOT / "matrices"
