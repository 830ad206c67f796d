"""Adapter layout, PEFT I/O, seeded noise and initialisation. No Ray, vLLM or W&B here."""
