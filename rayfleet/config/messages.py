"""One-line messages for configuration mistakes.

``describe(error, data, root)`` turns one pydantic validation error of ``data``
(validated as ``root``) into ``"<field path>: <reason> (got <value>)"``; an unknown key
gets ``"; did you mean '<closest known key>'?"`` from ``did_you_mean``, which the
engine-argument check (rayfleet/control/engine_args.py) uses for vLLM's flags too.
The caller prefixes the file name, one line per error, and raises ``ConfigError``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

Loc = Sequence[int | str]


def describe(error: ErrorDetails, data: Any, root: type[BaseModel]) -> str:
    """``error`` as one line naming the field path, the reason and the value given."""
    loc = list(error["loc"])
    path = field_path(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_for(root, loc[:-1])
        hint = did_you_mean(str(loc[-1]), list(parent.model_fields) if parent else [])
        return f"{path}: unknown field{hint}"
    if kind == "missing":
        return f"{path}: required field is missing"
    value = _value_at(data, loc)
    simple = loc and value is not _MISSING and not isinstance(value, (dict, list))
    shown = f" (got {value!r})" if simple else ""
    message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message}{shown}" if path else f"{message}{shown}"


def field_path(loc: Loc) -> str:
    """``["models", 0, "replicas"]`` as ``models[0].replicas``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def did_you_mean(word: str, choices: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, else the allowed ones, else ``""``."""
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if match:
        return f"; did you mean '{match[0]}'?"
    return f"; allowed: {', '.join(choices)}" if choices else ""


_MISSING = object()


def _value_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return data


def _model_for(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` under ``root`` (for suggestions)."""
    model = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        inner = getattr(annotation, "__args__", None)
        candidates = [annotation, *(inner or ())]
        nested = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nested is None:
            return None
        model = nested
    return model
