"""shardsim's simulator: predicts a distributed training step on a described cluster."""

__version__ = "0.1.0"
