"""The sweep: every valid configuration of a scenario, predicted, ranked and recommended.

The flow, one module a step: `space` (what to try: `SweepSpace`, `enumerate_configs`) →
`execute` (the predictions, on a process pool when it pays) → `rows` (one row a prediction)
→ `ranking` (rank within a cluster, scaling efficiency) → `search` (`sweep()`: all of it, one
table) → `recommendation` (`recommend()`) → `output`, `plots` (files) and `report` (terminal);
`cli` is the `shardsim sweep` command.

    from shardsim.simulator.sweep import SweepSpace, recommend, sweep

The names of `_EXPORTS` are imported on first use (`__getattr__`): `shardsim` imports this
package for every command, and the sweep's modules (and pandas, matplotlib) only when a sweep
runs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SweepSpace": "space",
    "Candidate": "space",
    "Enumeration": "space",
    "divisors": "space",
    "default_microbatches": "space",
    "enumerate_configs": "space",
    "default_workers": "execute",
    "predict_all": "execute",
    "predict_row": "execute",
    "COLUMNS": "rows",
    "SCALING_COLUMNS": "rows",
    "rank": "ranking",
    "scaling": "ranking",
    "sweep": "search",
    "DATA_PARALLEL": "recommendation",
    "recommend": "recommendation",
    "check_output_dir": "output",
    "write_tables": "output",
    "write_recommendation": "output",
    "to_records": "output",
    "plot_all": "plots",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # imported once: later look-ups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
