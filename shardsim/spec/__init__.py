"""The specification layer: what a model, a strategy and a cluster are, without costing them."""
