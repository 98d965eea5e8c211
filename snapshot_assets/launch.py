"""Submitting this code location's jobs to a Dagster instance from outside a sensor.

Two callers: `POST /snapshot` of `snapshotter serve` (a `force_snapshot` run per table) and the
ingest service's graceful shutdown (the final diff, shutdown.py). Both create the run in the
instance and hand it to the instance's run coordinator, exactly as `dagster job launch` does: the
run carries the code location's origin, so the daemon dequeues it (run queue limits included: one
run per table) and starts it through the same code location as the sensors' runs, on whatever host
that is. Nothing here executes a job.

The code location is loaded IN this process when its origin names a Python target this
interpreter can import (the repository's workspace.yaml, or the origin of the run the caller is
part of): no code server is spawned for a single submission, and the definitions are the ones
this process already imports. A location served elsewhere (`grpc_server` in the workspace) is
reached over gRPC instead. Dagster's internal workspace API is used because Dagster has no public
one for "submit a run of a job of a code location"; it is the code path of its own CLI.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import dagster as dg
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.remote_origin import CodeLocationOrigin, InProcessCodeLocationOrigin
from dagster._core.workspace.context import WorkspaceProcessContext, WorkspaceRequestContext
from dagster._core.workspace.load_target import (
    InProcessWorkspaceLoadTarget,
    WorkspaceFileTarget,
    WorkspaceLoadTarget,
)


class SubmitRun(Protocol):
    """(job name, tags, run config) -> the id of the run submitted to the Dagster instance (`Launcher.submit`)."""

    def __call__(self, job_name: str, tags: Mapping[str, str], run_config: Mapping[str, Any] | None = None) -> str:
        ...


FORCE_SNAPSHOT_JOB = "force_snapshot"


def force_snapshot_run(table: str, label: str = "") -> tuple[str, dict[str, str], dict[str, Any]]:
    """(job, tags, run config) of a forced snapshot of `table`; a `label` pins it (assets.SnapshotRequest)."""
    from snapshot_assets.tables import PARTITION_TAG, TABLE_TAG

    config: dict[str, Any] = {"ops": {"snapshot": {"config": {"label": label}}}} if label else {}
    return FORCE_SNAPSHOT_JOB, {PARTITION_TAG: table, TABLE_TAG: table}, config


class LaunchError(Exception):
    """A run could not be submitted: no workspace, no such location or job, a location that fails to load."""


def workspace_origin(path: Path, location: str | None = None) -> CodeLocationOrigin:
    """The origin of `location` (or of the only location) in a workspace file."""
    if not path.is_file():
        raise LaunchError(f"workspace file {path} does not exist (pass --workspace)")
    try:
        origins = {o.location_name: o for o in WorkspaceFileTarget([str(path)]).create_origins()}
    except Exception as e:  # a malformed file: Dagster raises several kinds
        raise LaunchError(f"workspace file {path}: {e}") from None
    if location is None:
        if len(origins) != 1:
            raise LaunchError(f"workspace file {path} has {len(origins)} code locations "
                              f"({', '.join(sorted(origins)) or 'none'}): choose one with --location")
        return next(iter(origins.values()))
    if location not in origins:
        raise LaunchError(f"workspace file {path} has no code location {location!r} "
                          f"(it has {', '.join(sorted(origins)) or 'none'})")
    return origins[location]


def run_origin(run: dg.DagsterRun) -> CodeLocationOrigin:
    """The code location a run was launched from (so a run can submit siblings to the same one)."""
    if run.remote_job_origin is None:
        raise LaunchError(f"run {run.run_id} was not launched through a code location (executed in process)")
    return run.remote_job_origin.repository_origin.code_location_origin


class _OriginTarget(WorkspaceLoadTarget):
    """A workspace of one code location, loaded the way its origin says (a gRPC server: connected to)."""

    def __init__(self, origin: CodeLocationOrigin) -> None:
        self.origin = origin

    def create_origins(self) -> list[CodeLocationOrigin]:
        return [self.origin]


def _load_target(origin: CodeLocationOrigin) -> WorkspaceLoadTarget:
    """In process when this interpreter can load the origin's Python target (module doc)."""
    target = getattr(origin, "loadable_target_origin", None)
    if target is not None and target.executable_path in (None, sys.executable):
        return InProcessWorkspaceLoadTarget(
            InProcessCodeLocationOrigin(target, container_image=None, location_name=origin.location_name))
    return _OriginTarget(origin)


class Launcher:
    """Submits runs of the code location at `origin` to `instance`; loads the location on first use."""

    def __init__(self, instance: dg.DagsterInstance, origin: CodeLocationOrigin) -> None:
        self.instance, self.origin = instance, origin
        self._lock = threading.Lock()
        self._context: WorkspaceProcessContext | None = None

    def _workspace(self) -> WorkspaceRequestContext:
        if self._context is None:
            self._context = WorkspaceProcessContext(self.instance, _load_target(self.origin), read_only=False)
        workspace = self._context.create_request_context()
        name = self.origin.location_name
        if workspace.has_code_location_error(name):
            error = workspace.get_code_location_error(name)
            raise LaunchError(f"code location {name!r} failed to load: {error.message if error else 'unknown error'}")
        return workspace

    def submit(self, job_name: str, tags: Mapping[str, str], run_config: Mapping[str, Any] | None = None) -> str:
        """Create a run of `job_name` with `tags` (and `run_config`) and submit it; returns its run id."""
        config = dict(run_config or {})
        with self._lock:
            workspace = self._workspace()
            location = workspace.get_code_location(self.origin.location_name)
            repos = location.get_repositories()
            repo = next((r for r in repos.values() if r.has_job(job_name)), None)
            if repo is None:
                raise LaunchError(f"code location {location.name!r} has no job {job_name!r}")
            job = location.get_job(JobSubsetSelector(location_name=location.name, repository_name=repo.name,
                                                     job_name=job_name, op_selection=None))
            plan = location.get_execution_plan(job, config, step_keys_to_execute=None, known_state=None,
                                               instance=self.instance)
            run = self.instance.create_run(
                job_name=job_name, run_id=None, run_config=config, resolved_op_selection=job.resolved_op_selection,
                step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute, op_selection=None,
                status=None, root_run_id=None, parent_run_id=None, tags={**job.tags, **tags},
                job_snapshot=job.job_snapshot, execution_plan_snapshot=plan.execution_plan_snapshot,
                parent_job_snapshot=job.parent_job_snapshot, remote_job_origin=job.get_remote_origin(),
                job_code_origin=job.get_python_origin(), asset_selection=None, asset_check_selection=None,
                asset_graph=repo.asset_graph)
            return self.instance.submit_run(run.run_id, workspace).run_id

    def close(self) -> None:
        with self._lock:
            if self._context is not None:
                self._context.__exit__(None, None, None)
                self._context = None

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


@contextlib.contextmanager
def launcher_for_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> Iterator[Launcher]:
    with Launcher(instance, run_origin(run)) as launcher:
        yield launcher
