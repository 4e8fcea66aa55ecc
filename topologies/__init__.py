"""Shipped instance-type descriptions (YAML). Loaded by name via simulator.topology."""
