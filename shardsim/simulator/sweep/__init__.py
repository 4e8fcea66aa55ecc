"""The sweep: every valid configuration of a scenario, predicted, ranked and recommended.

The flow, one module a step: `space` (what to try: `SweepSpace`, `enumerate_configs`) →
`execute` (the predictions, on a process pool when it pays) → `rows` (one row a prediction)
→ `ranking` (rank within a cluster, scaling efficiency) → `recommendation` (`recommend()`) →
`search` (`sweep()`: all of it, a `SweepResult`: the table, its recommendation, what was
skipped and dropped) → `output`, `plots` (files) and `report` (terminal); `shardsim.cli.sweep`
is the `shardsim sweep` command and `shardsim.sweep` the public function. Import a name from
the module that holds it:

    from shardsim.simulator.sweep.recommendation import recommend
    from shardsim.simulator.sweep.search import sweep
    from shardsim.simulator.sweep.space import SweepSpace

(This package imports nothing itself: the `shardsim` command loads it for every command, and
the sweep's modules, pandas and matplotlib only when a sweep runs.)
"""
