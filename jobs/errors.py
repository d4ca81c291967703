"""The project's exceptions (the CLI turns any of them into one line on stderr and exit code 2), and the
one-line summary of a Spark error."""


class TxnReconError(Exception):
    """Base of every error a user can cause and fix; its message is the whole story."""


class ConfigError(TxnReconError):
    """A configuration file is missing, malformed, or has an unknown key or a bad value."""


class SetupError(TxnReconError):
    """The environment is incomplete, e.g. the Delta jars were never fetched."""


class QueryError(TxnReconError):
    """Spark rejected a statement or a table is missing (translated from AnalysisException)."""


def first_line(e: BaseException) -> str:
    """The innermost Java cause of a Spark error (e.g. "EOFException: Unexpected end of input stream")."""
    throwable = getattr(e, "java_exception", None) or getattr(e, "_origin", None)
    if throwable is not None:
        while throwable.getCause() is not None:
            throwable = throwable.getCause()
        return f"{throwable.getClass().getSimpleName()}: {throwable.getMessage()}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
