"""User-facing errors: one line that names the key, or the file and line, at fault.

The exit code says whose move it is: 2 for bad input (fix the command line or the file),
1 for a run that could not go on (a diverged update, a failed write, an unreachable hub)."""

import os


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


def hub_refused(error: BaseException) -> bool:
    """Whether a failed read from the Hugging Face hub is the hub saying no (no such repository,
    revision, file or split; gated; or offline with nothing cached): bad input, exit 2. Anything
    else (the hub out of reach) is a runtime failure, exit 1 (docs/sweeps.md)."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hub

    refusals: tuple[type[BaseException], ...] = (
        hub.RepositoryNotFoundError,
        hub.RevisionNotFoundError,
        hub.GatedRepoError,
        hub.EntryNotFoundError,
        hub.OfflineModeIsEnabled,
        ValueError,  # `datasets`: an unknown config or split
    )
    try:
        from datasets.exceptions import DataFilesNotFoundError, DatasetNotFoundError

        refusals += (DatasetNotFoundError, DataFilesNotFoundError)
    except ImportError:  # datasets is the hub tasks' dependency, not every install's
        pass
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in OFFLINE_VALUES
    if isinstance(error, hub.LocalEntryNotFoundError):  # not cached, and the hub did not answer (an EntryNotFoundError)
        return bool(offline)
    return offline or isinstance(error, refusals)


OFFLINE_VALUES = ("1", "ON", "YES", "TRUE")  # as huggingface_hub and datasets read their *_OFFLINE


def hub_error(key: str, value: str, why: str, error: BaseException) -> EvoraError:
    """The one-line error of a failed hub read, its class (exit code) by `hub_refused`."""
    reason = (str(error).strip().splitlines() or [""])[0][:160]
    line = f'{key}="{value}": {why} ({type(error).__name__}{": " + reason if reason else ""})'
    return ConfigError(line) if hub_refused(error) else RunError(line)
