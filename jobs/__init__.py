"""The shell: command line, configuration, SparkSession, reads and writes; one module per job."""
