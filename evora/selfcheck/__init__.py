"""`evora doctor --run`: checks that execute on the node they run on, and a report to paste into an
issue (doctor-report.md / .json). `checks` declares what a check is and holds the registry;
`numerics` and `engine_checks` register the checks; `environment` says what the node has;
`runner` runs them and writes the report. bench/gpu_check.py runs the same checks."""
