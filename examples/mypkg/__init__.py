"""An example of a user's own reward, task and strategy for evora (see README and docs/architecture.md)."""
