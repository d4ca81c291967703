"""The project's exceptions. The CLI turns any of them into one line on stderr and exit code 2."""


class TxnReconError(Exception):
    """Base of every error a user can cause and fix; its message is the whole story."""


class ConfigError(TxnReconError):
    """A configuration file is missing, malformed, or has an unknown key or a bad value."""


class SetupError(TxnReconError):
    """The environment is incomplete, e.g. the Delta jars were never fetched."""


class QueryError(TxnReconError):
    """Spark rejected a statement or a table is missing (translated from AnalysisException)."""
