"""Every benchmark script still loads against today's code.

Why: the benchmarks are run by hand, so a script whose imports name a function that a refactor
removed breaks silently until someone next runs it (one did: a parquet-writer comparison importing
a writer that no longer existed). Loading each script as a module runs its imports and top-level
definitions without running the benchmark (each guards its work behind `__main__`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: Modules the scripts share, not scripts of their own.
LIBRARIES = {"__init__.py", "report.py"}
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in LIBRARIES)


def test_there_are_benchmark_scripts() -> None:
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_benchmark_script_loads(script: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
