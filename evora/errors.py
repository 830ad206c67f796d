"""User-facing errors: one line that names the key, or the file and line, at fault.

The exit code says whose move it is: 2 for bad input (fix the command line or the file),
1 for a run that could not go on (a diverged update, a failed write, an unreachable hub)."""


class EvoraError(Exception):
    """An error the CLI reports as one line, without a traceback."""

    exit_code = 2


class ConfigError(EvoraError):
    """A config value is missing, malformed or out of range."""


class DataError(EvoraError):
    """A data file cannot be read; the message names the file and line."""


class RunError(EvoraError):
    """The run cannot go on; the message names what to look at. The last checkpoint stays."""

    exit_code = 1
