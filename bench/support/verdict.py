"""The verdict every bench's summary line carries, and the exit status it gives.

A summary line is ``{"summary": NAME, <figures>, "goals": {figure: "<op> <target>"}, "met": bool, <the check's
fields>, "errors": [...], "correct": bool}``:

- ``goals``: what the bench is for, each a figure of the line (a dotted name reaches into a dict figure:
  ``"ratio.confluent"``) and its target; ``met`` is computed from them and the figures (a goal whose figure is
  missing, None or NaN is not met). A bench with no stated goal says so: ``"goals": {}``.
- the correctness check, computed from what the clients observed, record by record (by key or by offset, never a
  count that stops at N nor a literal): ``lost``, ``duplicated``, ``out_of_order``, ``unexpected``
  (:func:`delivery`) where records flow; other observed checks as named booleans (``"tables_equal": true``);
  ``errors``: what went wrong along the way; ``correct``: all of it held.

Exit status (:func:`exit_status`): 1 when the check failed; with ``--check``, also when a goal was not met.
Every bench takes ``--smoke`` (its whole path, check included, sized for seconds: ``python -m bench --smoke``
runs them all) and ``--check`` (:func:`add_options`).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

__all__ = ["Delivery", "Goal", "add_options", "at_least", "at_most", "delivery", "emit", "exit_status",
           "goals_met", "summary"]

#: (operator, target): the figure must be ``>=`` or ``<=`` the target
Goal = tuple[str, float]
S = TypeVar("S", bound=Hashable)  # a stream of records: a partition, a consumer's partition
R = TypeVar("R", bound=Hashable)  # a record's identity in its stream: an offset, a key


def at_least(target: float) -> Goal:
    return (">=", target)


def at_most(target: float) -> Goal:
    return ("<=", target)


def figure(figures: Mapping[str, Any], name: str) -> Any:
    """``name`` in ``figures``, a dotted name reaching into dict figures; None when absent."""
    value: Any = figures
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def goals_met(goals: Mapping[str, Goal], figures: Mapping[str, Any]) -> bool:
    """Every goal's figure is a number on the right side of its target."""
    for name, (op, target) in goals.items():
        value = figure(figures, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return False
        if not (value >= target if op == ">=" else value <= target):
            return False
    return True


@dataclass(frozen=True)
class Delivery:
    """What the receivers got of what was sent, record by record: sent records never received (``lost``),
    receptions of a record already received (``duplicated``), records received after one sent later than them
    in the same stream (``out_of_order``), and records received that were never sent (``unexpected``: a changed
    value, or another topic's record)."""

    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    unexpected: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.unexpected)

    def __add__(self, other: Delivery) -> Delivery:
        return Delivery(self.lost + other.lost, self.duplicated + other.duplicated,
                        self.out_of_order + other.out_of_order, self.unexpected + other.unexpected)

    def fields(self) -> dict[str, int]:
        return asdict(self)


def delivery(sent: Mapping[S, Sequence[R]], received: Mapping[S, Iterable[R]]) -> Delivery:
    """Compare, stream by stream (a partition; a receiver's partition), the records sent in their order with the
    records received in the order they were handed over. A record is its identity (an offset, a key, a value),
    distinct within its stream. A stream sent but never received loses every record in it; one received but
    never sent is unexpected."""
    lost = duplicated = out_of_order = unexpected = 0
    for stream in {*sent, *received}:
        position = {record: i for i, record in enumerate(sent.get(stream, ()))}
        seen: set[R] = set()
        highest = -1
        for record in received.get(stream, ()):
            if record in seen:
                duplicated += 1
                continue
            seen.add(record)
            i = position.get(record)
            if i is None:
                unexpected += 1
                continue
            out_of_order += i < highest
            highest = max(highest, i)
        lost += sum(1 for record in position if record not in seen)
    return Delivery(lost, duplicated, out_of_order, unexpected)


def summary(name: str, figures: Mapping[str, Any], goals: Mapping[str, Goal], *,
            check: Delivery | None = None, checks: Mapping[str, bool] | None = None,
            errors: Sequence[str] = ()) -> dict[str, Any]:
    """The summary line: ``figures``, the goals and whether they are met, the check (``check`` where records flow,
    ``checks`` for other observed facts, each True when it held), the errors and whether all of it held."""
    line: dict[str, Any] = {"summary": name, **figures,
                            "goals": {k: f"{op} {target:g}" for k, (op, target) in goals.items()},
                            "met": goals_met(goals, figures)}
    if check is not None:
        line.update(check.fields())
    line.update(checks or {})
    line["errors"] = list(errors)
    line["correct"] = (check is None or check.ok) and all((checks or {}).values()) and not errors
    return line


def exit_status(line: Mapping[str, Any], check_goals: bool) -> int:
    """1 when the summary's check failed, or (``--check``) a goal was not met; else 0."""
    return 0 if line["correct"] and (line["met"] or not check_goals) else 1


def emit(line: Mapping[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def add_options(ap: argparse.ArgumentParser, smoke: str) -> None:
    """``--smoke`` (``smoke`` says what it runs) and ``--check``, the options every bench takes."""
    ap.add_argument("--smoke", action="store_true",
                    help=f"a run of seconds through the whole path, its check included: {smoke}")
    ap.add_argument("--check", action="store_true", help="exit 1 also when a goal is not met")
