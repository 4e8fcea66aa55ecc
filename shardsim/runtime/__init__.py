"""The real runtime: the simulator's configurations executed with torch.distributed."""
