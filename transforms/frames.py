"""Small helpers shared by transforms and jobs."""

import functools
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def union_all(frames: list[DataFrame]) -> DataFrame:
    """Frames with the same columns, stacked (matched by name)."""
    return functools.reduce(DataFrame.unionByName, frames)


def differing(recomputed: DataFrame, stored: DataFrame, key: Sequence[str]) -> DataFrame:
    """The recomputed rows no stored row equals (nulls equal), compared with the stored rows sharing their
    keys only: a merge of those alone reads and rewrites less, and most recomputed rows are as they were."""
    names = recomputed.columns
    same = stored.join(F.broadcast(recomputed.select(*key)), on=list(key), how="left_semi").select(*names)
    equal = [F.col(f"r.{c}").eqNullSafe(F.col(f"s.{c}")) for c in names]
    return recomputed.alias("r").join(same.alias("s"), on=functools.reduce(lambda a, b: a & b, equal), how="left_anti")
