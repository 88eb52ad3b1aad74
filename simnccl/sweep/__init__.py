"""``simnccl sweep``: simulate a matrix of framework configs x policies x releases x GPU kinds x env knobs
(or scenario variants), in this process, a local process pool or on a Dask cluster, with results as a table,
CSV and JSON, resumable from its output file.

One concept per module: ``matrix`` (read, validate, count), ``cell`` (one simulation as plain data, and the
function every worker runs), ``deadline`` (a wall-clock limit in any thread), ``executors`` (where cells run),
``store`` (rows, the CSV and JSON files, resume), ``command`` (the CLI, progress, exit codes). Dask is
imported only when a Dask executor is chosen.
"""

from simnccl.sweep.command import add_sweep_parser, run_sweep
from simnccl.sweep.store import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "add_sweep_parser", "run_sweep"]
