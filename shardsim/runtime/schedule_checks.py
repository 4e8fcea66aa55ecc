"""What the runtime refuses of a pipeline that the simulator accepts (torch-free: the launcher
checks before anything is spawned)."""

from __future__ import annotations

from shardsim.config import Strategy
from shardsim.core.errors import ConfigError
from shardsim.specs.schedules import ALL, SINGLE, ZERO_BUBBLE
from shardsim.specs.stage_split import AUTO

TP_RUNS = tuple(name for name in ALL if name not in ZERO_BUBBLE)  # the schedules the runtime runs with tp > 1


def check_runtime_pipeline(s: Strategy, replicated: bool = False) -> None:
    """ConfigError (one line) for a pipeline the runtime does not run: layers_per_stage auto
    (settled from the simulator's predicted stage times); a multi-stage schedule
    (PipelineScheduleMulti) with tensor parallelism where it is zero-bubble (untried: the
    weight-gradient pass on DTensor stages); a zero-bubble one whose
    stages have data-parallel replicas (`replicated`): PyTorch 2.13's weight-gradient pass
    (stage_backward_weight) leaves DDP's and FSDP2's gradient sync out, and such a run's
    gradients differ from the single-process reference's."""
    if not s.spec.is_pipeline:
        return
    if s.layers_per_stage == AUTO:
        why = "layers_per_stage auto is settled by the simulator's stage times: give the runtime the counts"
        raise ConfigError(why, field="layers_per_stage")
    if s.schedule in SINGLE:
        return
    if s.tp > 1 and s.schedule in ZERO_BUBBLE:
        why = (
            f"schedule {s.schedule} with tp > 1 is modelled by the simulator only: the runtime runs tp > 1 with "
            f"{', '.join(TP_RUNS)}"
        )
        raise ConfigError(why, field="tp")
    if replicated and s.schedule in ZERO_BUBBLE:
        why = (
            f"schedule {s.schedule} with data-parallel replicas of a stage is modelled by the simulator only: "
            "PyTorch's weight-gradient pass does not sync the replicas' gradients (run it with one rank a stage)"
        )
        raise ConfigError(why, field="schedule")
