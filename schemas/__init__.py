"""The single source of truth for every landing record and table.

Definitions here are plain Python (no pyspark, no pyarrow) so the broker model can use them;
`schemas.spark` and `schemas.arrow` derive the engine types from the same constants.
"""

from schemas.landing import CONSUMER, COPY, HALF, LANDING, OFFSET, OP, REAL, TOPOLOGY, TRACE
from schemas.model import Field, Schema

__all__ = ["CONSUMER", "COPY", "HALF", "LANDING", "OFFSET", "OP", "REAL", "TOPOLOGY", "TRACE", "Field", "Schema"]
