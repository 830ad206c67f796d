"""User-facing errors: one line that names the key, or the file and line, at fault."""


class EvoraError(Exception):
    """An error the CLI reports as one line, without a traceback."""


class ConfigError(EvoraError):
    """A config value is missing, malformed or out of range."""


class DataError(EvoraError):
    """A data file cannot be read; the message names the file and line."""
