"""shardsim: a topology-aware performance simulator for distributed training, with a reference
PyTorch runtime that checks it.

The public API (docs/api.md): `load_config`, `predict`, `sweep`, `recommend`, `calibrate`,
`collective` (`shardsim.api`) and the types they take and return. `import shardsim` loads none
of them: each is imported on first use, so that importing the package stays cheap (no simpy,
numpy, pandas, matplotlib or torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import shardsim.sweep as _sweep_package  # noqa: F401 (loaded first: see below)
from shardsim.core.errors import ConfigError

# `shardsim.sweep` is the API's function, and also a subpackage's name (shardsim/sweep/: it has no
# __init__ and loads nothing): the subpackage is loaded here, first, and its name handed back to the
# function (`__getattr__`), so that loading one of its modules later does not bind the name again.
globals().pop("sweep")

if TYPE_CHECKING:
    from shardsim.api import calibrate, collective, load_config, predict, recommend, sweep
    from shardsim.config import RunConfig, Strategy
    from shardsim.simulator.calibration.apply import Calibration
    from shardsim.simulator.calibration.calibrate import CalibrationResult
    from shardsim.simulator.collective import CollectiveResult
    from shardsim.simulator.predict import StepPrediction
    from shardsim.simulator.sweep.recommendation import Recommendation
    from shardsim.simulator.sweep.search import SweepResult
    from shardsim.simulator.sweep.space import SweepSpace


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
    import shardsim.simulator.sweep.space as m

    return m


def _search():
    import shardsim.simulator.sweep.search as m

    return m


def _recommendation():
    import shardsim.simulator.sweep.recommendation as m

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


def _version() -> str:
    """The installed distribution's version (importlib.metadata: read on first use, as it is slow to load)."""
    from importlib import metadata

    try:
        return metadata.version("shardsim")
    except metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0.0.0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardsim' has no attribute {name!r}")
    value = getattr(module(), name)
    globals()[name] = value  # read once: later reads find it here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
