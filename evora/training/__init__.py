"""LoRA gradient training shared by strategies that train (PBT members; the SFT baseline next)."""
