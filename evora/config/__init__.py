"""The run's typed config (`schema`): plain dataclasses every other package may read."""
