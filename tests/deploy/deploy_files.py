"""Reading deploy/: the Dockerfile's instructions, the compose file's services, the commands they run.

The image cannot be built and the compose file cannot be run where the tests run (no container
runtime, no registry), so the tests read them the way Docker would and check every reference
against this repository and its installed entry points.
"""

from __future__ import annotations

import re
import shlex
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import click
import yaml  # type: ignore[import-untyped]  # (no stubs installed; only safe_load used)

from tests.e2e.conftest import REPO

DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions in order, continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return out


def dockerfile_env(instructions: list[Instruction]) -> dict[str, str]:
    """The ENV values (`KEY=value` form), later ones winning."""
    env: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            for item in shlex.split(ins.args):
                key, sep, value = item.partition("=")
                assert sep, f"ENV {ins.args!r}: only the KEY=value form is read here"
                env[key] = value
    return env


def workdir(instructions: list[Instruction]) -> PurePosixPath:
    """The image's working directory: where the repository's files are copied to."""
    (path,) = [PurePosixPath(i.args) for i in instructions if i.keyword == "WORKDIR"]
    return path


def copied(instructions: list[Instruction]) -> list[tuple[str, PurePosixPath]]:
    """(source relative to the build context, destination inside the image) per COPY source."""
    root = workdir(instructions)
    pairs: list[tuple[str, PurePosixPath]] = []
    for ins in instructions:
        if ins.keyword == "COPY":
            *sources, dest = shlex.split(ins.args)
            target = root / dest
            for source in sources:
                pairs.append((source, target / PurePosixPath(source).name if dest.endswith("/") else target))
    return pairs


def repo_path_in_image(path: str, instructions: list[Instruction]) -> Path | None:
    """The repository file an image path (absolute, or relative to WORKDIR) comes from, if copied."""
    image_path = workdir(instructions) / path
    for source, target in copied(instructions):
        if image_path == target or target in image_path.parents:
            return REPO / source / image_path.relative_to(target)
    return None


_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's interpolation with an empty shell environment: `${X:-default}` → default, `$$` → `$`."""
    if isinstance(value, str):
        def sub(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            assert match.group(2) is not None, f"{match.group(0)} has no default: compose needs it set"
            return match.group(2)
        return _VARIABLE.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def compose() -> dict[str, Any]:
    """The compose file as Docker Compose sees it: YAML merge keys applied, variables interpolated."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return dict(interpolate(data))


def dagster_yaml_env_names(path: Path) -> set[str]:
    """Every environment variable a dagster.yaml reads through `env:`."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if set(node) == {"env"}:
                names.add(str(node["env"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load(path.read_text()))
    return names


def parse_click(command: click.Command, args: list[str]) -> tuple[click.Command, Mapping[str, Any]]:
    """Parse `args` with a click CLI down to its leaf command (nothing runs); its parameters."""
    ctx = command.make_context(command.name or "cli", list(args))
    while isinstance(command, click.Group):
        with warnings.catch_warnings():  # click 8.2 deprecates protected_args; 9.0 folds it into args
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*ctx.protected_args, *ctx.args]
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None, f"no subcommand in {args}"
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return command, ctx.params
