"""Small helpers shared by transforms and jobs."""

import functools

from pyspark.sql import DataFrame


def union_all(frames: list[DataFrame]) -> DataFrame:
    """Frames with the same columns, stacked (matched by name)."""
    return functools.reduce(DataFrame.unionByName, frames)
