"""The sweep: every valid configuration of a scenario, predicted, ranked and recommended.

The flow, one module a step: `space` (what to try: `SweepSpace`, `enumerate_configs`) →
`execute` (the predictions, on a process pool when it pays) → `rows` (one row a prediction)
→ `ranking` (rank within a cluster, scaling efficiency) → `recommendation` (`recommend()`) →
`search` (`sweep()`: all of it, a `SweepResult`: the table, its recommendation, what was
skipped and dropped) → `output` (the sweep's folder and files). What people read of it (terminal
tables, plots, the HTML page) is `shardsim.report`; `shardsim.cli.sweep` is the `shardsim sweep`
command and `shardsim.sweep()` the public function (the name stays the function: import this
package's modules with `from shardsim.sweep import ...`). Import a name from the module that holds it:

    from shardsim.sweep.recommendation import recommend
    from shardsim.sweep.search import sweep
    from shardsim.sweep.space import SweepSpace

(This package imports nothing itself: the sweep's modules and pandas load only when a sweep runs.)
"""
