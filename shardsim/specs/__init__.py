"""What a run is described by, below the configuration, without costing it: the parallel
dimensions of its device mesh (`parallel_dims`), models (`model`: architectures, one spec a
family, Hugging Face mappers), strategy specs (`strategies`), the simulator's input bounds
(`bounds`) and the instance and cluster descriptions (`hardware`). It imports only
`shardsim.core` and `shardsim.data`."""
