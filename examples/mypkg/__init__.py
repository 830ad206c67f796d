"""An example of a user's own reward and task for evora (see README, "Tasks")."""
