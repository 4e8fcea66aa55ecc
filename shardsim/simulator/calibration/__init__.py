"""Calibration from measured runs: the model's named parameters (`parameters`), measurements read
from CSVs and run records (`measurements`), the fit and its cross-validation (`fit`), the
calibration file and its application over a topology (`apply`), the command (`cli`)."""
