"""Error types; the CLI maps them to exit codes in one place (cli/main.py)."""


class HicacheDiagError(Exception):
    """Base class for errors the tool reports without a traceback."""


class UsageError(HicacheDiagError):
    """Bad input from the user: one line on stderr, exit code 2, nothing started."""


class RunDirError(UsageError):
    """A run directory is missing or incomplete; the message says what is missing."""


class EngineStartError(HicacheDiagError):
    """An engine never became ready (a settings assert, a missing driver): the environment
    failed, not a rank; the trial records it and the verdict is `undecided`."""
