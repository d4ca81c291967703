"""The project's exceptions (the CLI turns each into one line on stderr), the one-line summary of a
Spark error, and the line between a file Spark cannot read and a failure of Spark itself."""

from collections.abc import Iterator
from typing import Any

# Spark's error condition for a file whose content it cannot read (a truncated gzip, a corrupt footer).
UNREADABLE_FILE = "FAILED_READ_FILE"
# What the operating system says when the machine, not the file, is at fault; Spark may report such a
# failure of a read as FAILED_READ_FILE too.
MACHINE_FAULTS = ("No space left on device", "Input/output error", "Too many open files", "Cannot allocate memory")


class TxnReconError(Exception):
    """Base of every error a user can cause and fix; its message is the whole story."""


class ConfigError(TxnReconError):
    """A configuration file is missing, malformed, or has an unknown key or a bad value."""


class SetupError(TxnReconError):
    """The environment is incomplete, e.g. the Delta jars were never fetched."""


class QueryError(TxnReconError):
    """Spark rejected a statement or a table is missing (translated from AnalysisException)."""


class EngineError(Exception):
    """Spark, the JVM, the Py4J gateway, memory or the disk failed: not the input's fault. The run ends
    (exit code 1), nothing is quarantined for it, and the next run reads the same files again."""


def first_line(e: BaseException) -> str:
    """The type and the first line of the innermost Java cause of a Spark error (e.g. "EOFException: Unexpected
    end of input stream"), or of a Python error. Spark's own messages go on with the query plan or the SQL
    text, which a log line or an error line has no room for."""
    chain = list(_java_chain(e))
    name, text = (chain[-1].getClass().getSimpleName(), chain[-1].getMessage()) if chain else (type(e).__name__, str(e))
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return f"{name}: {lines[0]}" if lines else name


def _java_chain(e: BaseException) -> Iterator[Any]:
    """The Java throwable behind a Spark error and its causes, outermost first (none for a Python error,
    such as the ConnectionRefusedError of a JVM that has died)."""
    throwable = getattr(e, "java_exception", None) or getattr(e, "_origin", None)
    while throwable is not None:
        yield throwable
        throwable = throwable.getCause()


def is_unreadable_file(e: BaseException) -> bool:
    """Whether Spark failed on the content of a file it read, with the JVM alive and the machine sound.
    Anything else (a dead JVM, an OutOfMemoryError, a full disk) is a failure of the engine."""
    chain = [(t.getClass().getName(), str(t.getMessage())) for t in _java_chain(e)]
    return (
        any(message.startswith(f"[{UNREADABLE_FILE}") for _, message in chain)
        and not any(name.endswith("Error") for name, _ in chain)  # java.lang.OutOfMemoryError and the like
        and not any(fault in message for _, message in chain for fault in MACHINE_FAULTS)
    )
