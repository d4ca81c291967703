"""The dashboard: pure functions from the data `txn-recon report` gathers to one self-contained HTML page
(page) with inline SVG charts (charts). No Spark and no I/O here; jobs/report.py reads the tables."""
