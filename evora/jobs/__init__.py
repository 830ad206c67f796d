"""Job runners: jobs that drive the distributed runtime with a framework of their own (PBT
with Ray Tune), above `evora.distributed` in the package graph. A strategy's registration
names its runner by import path, so a strategy package never imports its runner."""
