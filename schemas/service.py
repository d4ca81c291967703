"""What `txn-recon serve` records: one row per cycle."""

from schemas.model import Field, Schema

STEPS = ("collect", "ingest", "reconcile", "quality", "report", "compact")

SERVE_CYCLES = Schema(
    "serve_cycles",
    (
        Field("cycle_id", "string"),
        Field("started_at", "timestamp"),
        Field("finished_at", "timestamp"),
        Field(
            "status",
            "string",
            doc="ok; failed (a step failed; the next cycle tries again); stopped (by a signal, between two "
            "steps); idle (nothing new to ingest: the other steps rested)",
        ),
        *(
            Field(f"{step}_s", "double", nullable=True, doc=f"seconds the {step} step took; null: not run")
            for step in STEPS
        ),
        Field("inserted", "long", doc="bronze records this cycle added"),
        Field("quarantined", "long"),
        Field("anomalies", "long", nullable=True, doc="findings after this cycle's reconcile"),
        Field("quality_failed", "long", nullable=True, doc="failed expectations of this cycle's checks"),
        Field(
            "spark_jobs",
            "long",
            nullable=True,
            doc="Spark jobs the cycle's steps and its metrics ran (Spark's own count; recording this row is not in it)",
        ),
        Field("error", "string", nullable=True, doc="the failed step's one line"),
    ),
    key=("cycle_id",),
)
