"""The job steps' table (migration 0003_steps): a mixin of SqlStore, as policy_tables.py is."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Insert, func, select
from sqlalchemy.engine import Connection, Row

from garrison.model.steps import Step, StepLayout, StepNode, StepState

from . import schema


def layout_to_json(layout: StepLayout) -> str:
    return json.dumps([
        {"node": n.node, "tasks": list(n.tasks), "task_gpus": [list(g) for g in n.task_gpus],
         "task_cpus": [list(c) for c in n.task_cpus], "held_gpus": list(n.held_gpus), "held_cpus": list(n.held_cpus)}
        for n in layout.nodes
    ], separators=(",", ":"))


def layout_from_json(text: str) -> StepLayout:
    nodes = json.loads(text)
    if not isinstance(nodes, list):
        raise ValueError(f"stored step layout is not a list: {text[:80]!r}")
    return StepLayout(nodes=tuple(
        StepNode(node=str(n["node"]), tasks=tuple(int(t) for t in n["tasks"]),
                 task_gpus=tuple(tuple(int(g) for g in row) for row in n["task_gpus"]),
                 task_cpus=tuple(tuple(int(c) for c in row) for row in n["task_cpus"]),
                 held_gpus=tuple(int(g) for g in n.get("held_gpus", ())),
                 held_cpus=tuple(int(c) for c in n.get("held_cpus", ())))
        for n in nodes
    ))


def _step_row(step: Step) -> dict[str, Any]:
    return {
        "job_id": step.job_id, "step_id": step.step_id, "name": step.name, "user_name": step.user, "uid": step.uid,
        "argv_json": json.dumps(list(step.argv), separators=(",", ":")), "layout_json": layout_to_json(step.layout),
        "state": step.state.value, "start_time": step.start_time, "end_time": step.end_time,
        "exit_code": step.exit_code, "reason": step.reason,
    }


def _step_from_row(row: Row[Any]) -> Step:
    return Step(
        job_id=row.job_id, step_id=row.step_id, name=row.name, user=row.user_name, uid=row.uid,
        argv=tuple(str(a) for a in json.loads(row.argv_json)), layout=layout_from_json(row.layout_json),
        state=StepState(row.state), start_time=row.start_time, end_time=row.end_time, exit_code=row.exit_code,
        reason=row.reason,
    )


class StepTables:
    """SqlStore's step methods (see interface.Store)."""

    def _write(self) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError

    def _snapshot(self) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError

    def _upsert(self, table: Any) -> Insert:
        raise NotImplementedError

    def save_step(self, step: Step) -> None:
        with self._write() as connection:
            connection.execute(self._upsert(schema.job_steps), [_step_row(step)])

    def last_step_id(self, job_id: int) -> int | None:
        with self._snapshot() as connection:
            value = connection.execute(
                select(func.max(schema.job_steps.c.step_id)).where(schema.job_steps.c.job_id == job_id)
            ).scalar()
        return None if value is None else int(value)

    def query_steps(self, job_ids: Sequence[int] = (), users: Sequence[str] = (), limit: int = 10000,
                    running_only: bool = False) -> list[Step]:
        table = schema.job_steps
        query = select(table)
        if running_only:
            query = query.where(table.c.state == StepState.RUNNING.value)
        if job_ids:
            query = query.where(table.c.job_id.in_(list(job_ids)))
        if users:
            query = query.where(table.c.user_name.in_(list(users)))
        query = query.order_by(table.c.job_id, table.c.step_id).limit(limit)
        with self._snapshot() as connection:
            rows = connection.execute(query).all()
        return [_step_from_row(row) for row in rows]
