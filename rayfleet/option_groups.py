"""Command-line options declared once, as typed groups.

A group is a frozen dataclass whose fields carry their ``typer.Option`` in ``Annotated``;
its ``PANEL`` names the ``--help`` panel the options are listed under::

    @dataclass(frozen=True)
    class Load:
        PANEL: ClassVar[str] = "Load shape"
        request_rate: Annotated[float, typer.Option(help="Requests per second.")] = math.inf

    @app.command()
    @option_groups
    def bench(target: Target, load: Load) -> None: ...

``option_groups`` shows typer one option per field (a field's own ``rich_help_panel``
wins over the group's) and calls the command with each group built from the parsed
values. Parameters that are not groups (``typer.Context``, arguments, single options)
pass through unchanged. Imports only typer.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from typer.models import ParameterInfo

R = TypeVar("R")


def option_groups(command: Callable[..., R]) -> Callable[..., R]:
    """``command`` with every dataclass-typed parameter spread into its fields' options."""
    hints = typing.get_type_hints(command, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for param in inspect.signature(command).parameters.values():
        kind = hints.get(param.name, param.annotation)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            fields = group_parameters(kind)
            groups[param.name] = (kind, [field.name for field in fields])
            parameters.extend(fields)
        else:
            parameters.append(param.replace(kind=param.KEYWORD_ONLY, annotation=kind))
    names = [p.name for p in parameters]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TypeError(f"{command.__name__}: options declared twice: {', '.join(twice)}")

    @functools.wraps(command)
    def parsed(**values: Any) -> R:
        for name, (group, fields) in groups.items():
            values[name] = group(**{field: values.pop(field) for field in fields})
        return command(**values)

    parsed.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    parsed.__annotations__ = {p.name: p.annotation for p in parameters}
    return parsed


def group_parameters(group: type) -> list[inspect.Parameter]:
    """One keyword parameter per field of ``group``, its option placed in the group's panel."""
    hints = typing.get_type_hints(group, include_extras=True)
    panel = getattr(group, "PANEL", None)
    parameters = []
    for field in dataclasses.fields(group):
        base, *metadata = typing.get_args(hints[field.name])
        if not any(isinstance(info, ParameterInfo) for info in metadata):
            raise TypeError(f"{group.__name__}.{field.name} has no typer.Option in Annotated")
        metadata = [_in_panel(info, panel) for info in metadata]
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        annotation = Annotated[(base, *metadata)]  # type: ignore[valid-type]
        parameters.append(
            inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return parameters


def _in_panel(info: object, panel: str | None) -> object:
    if not isinstance(info, ParameterInfo) or panel is None or info.rich_help_panel:
        return info
    placed = copy.copy(info)
    placed.rich_help_panel = panel
    return placed
