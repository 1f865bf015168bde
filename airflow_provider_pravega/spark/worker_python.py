"""The interpreter a local session's Python workers start with: pyspark's compiled modules, not its zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's ``PYTHONPATH``.
Python never caches bytecode for modules imported from a zip, so each worker process compiles
pyspark's modules from source again. With pyspark installed by pip, ``SPARK_HOME`` is the
installed package itself, whose modules pip compiled at install. A local session starts four
daemons before its first export has read an event (Spark's lookup of data sources, the data
source's creation, its planning, the reads), each compiling pyspark on its own. Measured on a cold
export of 400 events (local session, 2 cores): the Python workers took 3.9-4.1 CPU-s and the export
7.3-7.7 s with the zip, 1.8-2.1 CPU-s and 5.4-6.1 s without it (docs/benchmarks.md).

``pravega-spark-python`` (a console script of this package, :func:`main`) drops that zip from
``PYTHONPATH`` when it is the one inside the installed pyspark package (the same files, compiled),
and then becomes this interpreter with the same arguments. A zip of any other Spark installation is
left where Spark put it. :func:`worker_python` is what
:func:`~airflow_provider_pravega.spark.session.get_spark_session` gives a local session as
``PYSPARK_PYTHON`` unless one is set.

Every worker process imports this module before it becomes the interpreter: it imports only the
standard library (and the package's ``__init__`` modules, which import nothing heavy).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from importlib.machinery import PathFinder

__all__ = ["SCRIPT", "main", "without_installed_pyspark_zip", "worker_python"]

#: The console script (``[project.scripts]`` in pyproject.toml) that runs :func:`main`.
SCRIPT = "pravega-spark-python"


def _installed_pyspark_zip(search_path: list[str]) -> str | None:
    """The zip Spark ships inside the pyspark package found on ``search_path``, if there is one."""
    spec = PathFinder.find_spec("pyspark", search_path)
    if spec is None or not spec.submodule_search_locations:
        return None
    home = os.path.realpath(next(iter(spec.submodule_search_locations)))
    return os.path.join(home, "python", "lib", "pyspark.zip")


def without_installed_pyspark_zip(pythonpath: str, search_path: list[str]) -> str:
    """``pythonpath`` without the installed pyspark's own ``pyspark.zip``.

    ``search_path`` is where the interpreter finds installed packages (its ``sys.path`` without
    ``PYTHONPATH``'s entries). A zip that belongs to another Spark installation, or an installed
    pyspark that has no zip of its own, leaves ``pythonpath`` as it is."""
    entries = pythonpath.split(os.pathsep) if pythonpath else []
    zips = [entry for entry in entries if os.path.basename(entry) == "pyspark.zip"]
    if not zips:
        return pythonpath
    own = _installed_pyspark_zip([entry for entry in search_path if entry not in entries])
    if own is None:
        return pythonpath
    kept = [entry for entry in entries if not (entry in zips and os.path.realpath(entry) == own)]
    return os.pathsep.join(kept)


def main() -> None:
    """Become this interpreter with the same arguments, without the installed pyspark's zip."""
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        os.environ["PYTHONPATH"] = without_installed_pyspark_zip(pythonpath, sys.path)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


def _script_interpreter(script: str) -> str | None:
    """The interpreter a console script's ``#!`` line names, or None."""
    try:
        with open(script, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return words[0] if words else None


def worker_python() -> str:
    """The executable for a local session's Python workers: :data:`SCRIPT` when it is installed
    for this very interpreter (its ``#!`` names this interpreter, or a link to it in the same
    directory, as in a virtual environment's ``bin``), else this interpreter itself (a source
    checkout on ``PYTHONPATH``, a script from another environment)."""
    script = os.path.join(sysconfig.get_path("scripts"), SCRIPT)
    interpreter = _script_interpreter(script)
    if interpreter is None or not os.access(script, os.X_OK):
        return sys.executable
    directory = os.path.realpath(os.path.dirname(os.path.abspath(interpreter)))
    same_directory = directory == os.path.realpath(os.path.dirname(os.path.abspath(sys.executable)))
    if same_directory and os.path.realpath(interpreter) == os.path.realpath(sys.executable):
        return script
    return sys.executable
