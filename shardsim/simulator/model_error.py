"""The model's own error, per device and stack: the one-sigma error of one prediction in log
throughput (about the relative error), as measured against real runs in this repository, and a
larger stated figure where nothing was measured.

Measured (each figure is the root mean square of log(measured / predicted) over the rows named;
`experiments/readings/band-coverage.md` recomputes them):

- training steps on an A100 40GB with PyTorch's FSDP: 0.060, the 78 MPT runs of the A100
  calibration table, each predicted by a fit to the other folds (5-fold cross-validation,
  `experiments/calibration/rows.csv`, column ``cv_err_pct``);
- training steps of the emulated clusters (CPU ranks, gloo, PyTorch): 0.059, the 130 measured
  rows of `experiments/validation/**/validation.csv`;
- NCCL collectives on p5.48xlarge over EFA (two or more nodes): 0.089, the 32 sizes of the
  nccl-tests all-reduce curve on 2 nodes (`experiments/calibration/data/nccl-all-reduce-p5-2node.csv`).

Everything else (a T4, a V100, an H100's training step, SageMaker's or DeepSpeed's library, a
collective on another fabric) is "not measured here" and takes `NOT_MEASURED`, a named choice:
2.5 times the measured stacks' error, as the figures fitted on the A100 are carried to a device
whose kernels no row of this repository checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NOT_MEASURED = 0.15  # the stated one-sigma log error of a device / stack with no measured rows here
NOT_MEASURED_TEXT = "not measured here"
NOT_MEASURED_SOURCE = f"the stated default {NOT_MEASURED:g} for a device or stack without measured rows"


@dataclass(frozen=True)
class ModelError:
    """The one-sigma error of one prediction (``sigma``, log throughput), whether rows of this
    device and stack were measured, and where the figure comes from."""

    sigma: float
    measured: bool
    source: str
    stack: str  # the device and stack the figure is for, as printed

    @property
    def pct(self) -> float:
        """The one-sigma band in percent of the predicted figure."""
        return 100 * math.expm1(self.sigma)

    def text(self) -> str:
        """``±6.2 % (NVIDIA A100 SXM4 40GB, pytorch; measured: <source>)``, or ``not measured here: ...``."""
        return f"±{self.pct:.1f} % ({self.stack}; {'measured' if self.measured else NOT_MEASURED_TEXT}: {self.source})"

    def short(self) -> str:
        """``±6.2 % (NVIDIA A100 SXM4 40GB, pytorch; measured)``: `text` without its source."""
        return f"±{self.pct:.1f} % ({self.stack}; {'measured' if self.measured else NOT_MEASURED_TEXT})"

    def to_dict(self) -> dict:
        return {
            "sigma_log": self.sigma, "band_pct": round(self.pct, 3), "measured": self.measured, "source": self.source,
            "stack": self.stack,
        }  # fmt: skip


@dataclass(frozen=True)
class _Measured:
    sigma: float
    source: str


# (device model, library) → its training steps' measured error
STEPS: dict[tuple[str, str], _Measured] = {
    ("NVIDIA A100 SXM4 40GB", "pytorch"): _Measured(
        0.060, "78 MPT runs (FSDP, bf16), 5-fold cross-validated, experiments/calibration/rows.csv"
    ),
    ("host CPU share", "pytorch"): _Measured(
        0.059, "130 runs on the emulated clusters, experiments/validation/**/validation.csv"
    ),
}
# instance type → its NCCL collectives' measured error over its inter-node network
COLLECTIVES: dict[str, _Measured] = {
    "p5.48xlarge": _Measured(
        0.089, "nccl-tests all_reduce, 32 sizes on 2 nodes, experiments/calibration/data/nccl-all-reduce-p5-2node.csv"
    ),
}


def step_error(device: str, library: str = "pytorch") -> ModelError:
    """The error of a training step's prediction on `device` (a topology's ``device.model``)
    with `library`."""
    stack = f"{device}, {library}"
    found = STEPS.get((device, library))
    if found is None:
        return ModelError(NOT_MEASURED, False, NOT_MEASURED_SOURCE, stack)
    return ModelError(found.sigma, True, found.source, stack)


def collective_error(instance: str, nodes: int, backend: str = "nccl") -> ModelError:
    """The error of a collective's predicted time on `nodes` nodes of `instance` with `backend`
    (NCCL measured over two or more nodes: within one node, or gloo, not measured here)."""
    stack = f"{backend} on {instance}, {nodes} node{'s' if nodes != 1 else ''}"
    found = COLLECTIVES.get(instance) if nodes >= 2 and backend == "nccl" else None
    if found is None:
        return ModelError(NOT_MEASURED, False, NOT_MEASURED_SOURCE, stack)
    return ModelError(found.sigma, True, found.source, stack)


def total_sigma(*sigmas: float) -> float:
    """Independent errors in log throughput added: the root of the sum of their squares."""
    return math.sqrt(sum(s * s for s in sigmas))
