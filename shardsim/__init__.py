"""shardsim: a topology-aware performance simulator for distributed training, with a reference
PyTorch runtime that checks it.

The public API (docs/api.md): `load_config`, `predict`, `sweep`, `recommend`, `calibrate`,
`collective` (`shardsim.api`) and the types they take and return. `import shardsim` loads none
of them: each is imported on first use, so that importing the package stays cheap (no simpy,
numpy, pandas, matplotlib or torch).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError
from shardsim.core.version import version

if TYPE_CHECKING:
    from shardsim.api import calibrate, collective, load_config, predict, recommend, sweep
    from shardsim.config import RunConfig, Strategy
    from shardsim.simulator.calibration.apply import Calibration
    from shardsim.simulator.calibration.calibrate import CalibrationResult
    from shardsim.simulator.collective import CollectiveResult
    from shardsim.simulator.predict import StepPrediction
    from shardsim.sweep.recommendation import Recommendation
    from shardsim.sweep.search import SweepResult
    from shardsim.sweep.space import SweepSpace


# Where each public name lives, imported by name (so import-graph tools follow it) when first read
def _api():
    import shardsim.api as m

    return m


def _config():
    import shardsim.config as m

    return m


def _predict():
    import shardsim.simulator.predict as m

    return m


def _space():
    from shardsim.sweep import space as m

    return m


def _search():
    from shardsim.sweep import search as m

    return m


def _recommendation():
    from shardsim.sweep import recommendation as m

    return m


def _calibrate():
    import shardsim.simulator.calibration.calibrate as m

    return m


def _calibration_file():
    import shardsim.simulator.calibration.apply as m

    return m


def _collective():
    import shardsim.simulator.collective as m

    return m


_LAZY = {
    "load_config": _api,
    "predict": _api,
    "sweep": _api,
    "recommend": _api,
    "calibrate": _api,
    "collective": _api,
    "RunConfig": _config,
    "Strategy": _config,
    "StepPrediction": _predict,
    "SweepSpace": _space,
    "SweepResult": _search,
    "Recommendation": _recommendation,
    "CalibrationResult": _calibrate,
    "Calibration": _calibration_file,
    "CollectiveResult": _collective,
}

__all__ = [
    "Calibration",
    "CalibrationResult",
    "CollectiveResult",
    "ConfigError",
    "Recommendation",
    "RunConfig",
    "StepPrediction",
    "Strategy",
    "SweepResult",
    "SweepSpace",
    "__version__",
    "calibrate",
    "collective",
    "load_config",
    "predict",
    "recommend",
    "sweep",
]


def __getattr__(name: str):
    if name == "__version__":
        globals()[name] = value = version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardsim' has no attribute {name!r}")
    value = getattr(module(), name)
    globals()[name] = value  # read once: later reads find it here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(ModuleType):
    """`shardsim` itself: `shardsim.sweep` stays the public function when the subpackage of the
    same name (`shardsim/sweep/`) is imported, which would otherwise bind it in its place. Import
    the subpackage's modules with `from shardsim.sweep import space` or
    `from shardsim.sweep.space import SweepSpace`, not as `shardsim.sweep.space` attributes."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "sweep" and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
