"""What a run is, before any configuration file: parallel dimensions, models, hardware."""
