"""What a run is described by, below the configuration: strategy specs (`strategies`), the
simulator's input bounds (`bounds`) and the instance and cluster descriptions (`hardware`).
It imports only `shardsim.core` and `shardsim.data`."""
