"""`shardsim validate`: predicted vs measured step times on emulated clusters.

A *matrix* (`matrix`) names a workload and its settings, and per emulated topology the
configurations to check. For every configuration the runtime runs it for real inside the
emulated cluster (a network namespace per node, tc-shaped NICs), the simulator predicts it
from a measured profile (`profiling`: blocks at each microbatch size, the cluster's links, the
cores its ranks really get), and the two are compared (`rows`, `report`): error % per row, the
mean absolute percentage error, the largest error, and per topology whether the predicted-best
configuration and the predicted-best sharded data-parallel degree are the measured-best ones.

Quiet steps: a virtual machine's hypervisor may run other guests on its cores for minutes at a
time, which measures them as much as the configuration. A step in
which it took more than `max_steal` of the cores' time is set aside; a configuration with
fewer than half its steps quiet is run again after the others (`measure`), at most `retries`
more times, and its quiet steps of every attempt are what is measured. One that never gets
them is measured over all its steps, predicted with the steal taken off the cores, and marked.

Resumable: every finished run is written at once (``validation.json``, ``validation.csv``);
a second call runs only what is missing, failed or still owed a quiet attempt, and
re-predicts every row (cheap), so a better model re-scores old measurements without running
them again. What an earlier call left is checked as it is read back (`resume`): a torn
validation.json is rebuilt from the runs it indexes (runs/*.json), a torn run or runs.csv is
named, exit 2; nothing is silently run again or discarded.
"""

from shardsim.runtime.validation.matrix import DEFAULT_MATRIX, MATRICES, Matrix, load_matrix, steal_bound
from shardsim.runtime.validation.measure import validate
from shardsim.runtime.validation.profiling import ensure_profile
from shardsim.runtime.validation.report import markdown, save, summarize
from shardsim.runtime.validation.resume import earlier_rows, load_rows, rebuild_rows
from shardsim.runtime.validation.rows import Row, add_attempt, pooled_slowdown, quiet_steps, row_slowdown, settle

__all__ = [
    "DEFAULT_MATRIX",
    "MATRICES",
    "Matrix",
    "Row",
    "add_attempt",
    "earlier_rows",
    "ensure_profile",
    "load_matrix",
    "load_rows",
    "markdown",
    "pooled_slowdown",
    "quiet_steps",
    "rebuild_rows",
    "row_slowdown",
    "save",
    "settle",
    "steal_bound",
    "summarize",
    "validate",
]
