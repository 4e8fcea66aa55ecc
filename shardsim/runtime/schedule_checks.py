"""What the runtime refuses of a pipeline that the simulator accepts (torch-free: the launcher
checks before anything is spawned)."""

from __future__ import annotations

from shardsim.config import Strategy
from shardsim.core.errors import ConfigError
from shardsim.specs.schedules import SINGLE


def check_runtime_pipeline(s: Strategy) -> None:
    """ConfigError (one line) for a pipeline the runtime does not run: a multi-stage schedule
    (PipelineScheduleMulti) or a layer split other than the even one."""
    if not s.spec.is_pipeline:
        return
    if s.schedule not in SINGLE:
        why = f"schedule {s.schedule} is modelled by the simulator only: the runtime runs {' and '.join(SINGLE)}"
        raise ConfigError(why, field="schedule")
    if s.layers_per_stage is not None:
        why = "layers_per_stage is modelled by the simulator only: the runtime splits the layers evenly"
        raise ConfigError(why, field="layers_per_stage")
