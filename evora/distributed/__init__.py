"""The distributed runtime: the driver actor's loop, the engine worker pool, evaluation and the finish."""
