"""shardsim's simulator: predicts a distributed training step on a described cluster.

What the sweep and the report use of it: `predict` (`predict`,
`prepare`, `chain_bound_s`, `step_memory`, `rank_workload`, `StepPrediction`, `Prepared`),
`bounds` (`compute_bound_s`), `results` (the result key, the schema and its upgrades),
`economics` (`MODEL_ERROR`), `model_error` (`step_error`, `ModelError`), `gcpause`
(`paused_gc`), `calibration.apply` (`load_calibration`), `hardware.profile` (`load_profile`),
`scale` (the plan's and the sweep's bounds), `attention_impl` (`cudnn_refusal`: where cuDNN's
attention cannot run) and `workload`;
the descriptions it is given come from `shardsim.specs` (hardware, strategies, bounds).
"""

__version__ = "0.1.0"
