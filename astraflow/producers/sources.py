"""Dataset readers: JSONL and Parquet rows → :class:`TaskSpec` (prompt messages + reference).

Field mapping (``producer.fields``): a ``messages`` list of ``{role, content}`` wins over a
``prompt`` string (one user message); the reference is the ``reference`` mapping when present,
else the ``reference_fields`` (``answer``, ``tests``) that the row has; the id is the ``id``
field, else ``"<dataset>:<row index>"``. With ``answer_regex`` the reference's ``answer`` becomes
what the regex finds in it (GSM8K's ``... #### 42`` → ``42``). Every problem names the file and
the line (JSONL) or row (Parquet).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraflow.core.errors import AstraflowError
from astraflow.core.records import ChatMessage


class SourceError(AstraflowError):
    """A dataset file or row could not be read into a task."""


@dataclass(frozen=True)
class TaskSpec:
    """A task before it gets its run-specific fields (n_samples, workflow, attempt)."""

    id: str
    prompt: list[ChatMessage]
    reference: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


def with_system(prompt: list[ChatMessage], system: str | None) -> list[ChatMessage]:
    """``prompt`` as the producer releases it: ``producer.system_prompt`` first when set. The
    one place it is added, for the producer, the evaluators, the warm-up's demonstrations and
    `astraflow check` alike (a model trained or measured on a format it never samples in
    learns or shows the wrong thing)."""
    return [ChatMessage(role="system", content=system), *prompt] if system else list(prompt)


def row_to_spec(row: Any, *, where: str, index: int, dataset: str, fields: Any) -> TaskSpec:
    """Map one row (a JSON object / Parquet record) to a TaskSpec; ``where`` names it in errors."""
    if not isinstance(row, Mapping):
        raise SourceError(f"{where}: expected an object, got {type(row).__name__}")
    messages = row.get(fields.messages)
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise SourceError(f"{where}: {fields.messages!r} must be a non-empty list of "
                              "{role, content} objects")
        prompt = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
                    m.get("content"), str):
                raise SourceError(f"{where}: {fields.messages}[{i}] must be an object with "
                                  "string 'role' and 'content'")
            prompt.append(ChatMessage(role=m["role"], content=m["content"], name=m.get("name")))
    else:
        text = row.get(fields.prompt)
        if not isinstance(text, str) or not text:
            raise SourceError(f"{where}: no prompt: expected a {fields.prompt!r} string or a "
                              f"{fields.messages!r} list (the row has: {', '.join(sorted(row))})")
        prompt = [ChatMessage(role="user", content=text)]
    ref = row.get(fields.reference)
    if ref is not None:
        if not isinstance(ref, Mapping):
            raise SourceError(f"{where}: {fields.reference!r} must be an object")
        reference = dict(ref)
    else:
        reference = {k: row[k] for k in fields.reference_fields if row.get(k) is not None}
    regex = getattr(fields, "answer_regex", None)
    if regex is not None:
        reference = {**reference, "answer": _match_answer(regex, reference, where)}
    raw_id = row.get(fields.id)
    task_id = str(raw_id) if raw_id is not None and str(raw_id) else f"{dataset}:{index}"
    return TaskSpec(id=task_id, prompt=prompt, reference=reference)


def _match_answer(regex: str, reference: Mapping[str, Any], where: str) -> str:
    if reference.get("answer") is None:
        raise SourceError(f"{where}: producer.fields.answer_regex is set but the reference has no "
                          f"'answer' (it has: {', '.join(sorted(reference)) or 'nothing'}); map "
                          "the answer column with producer.fields.reference_fields")
    text = str(reference["answer"])
    m = re.search(regex, text)
    if m is None:
        raise SourceError(f"{where}: producer.fields.answer_regex {regex!r} does not match the "
                          f"answer {text[-80:]!r}")
    return (m.group(1) if m.re.groups else m.group(0)).strip()


def read_jsonl(path: str | Path, *, dataset: str, fields: Any) -> Iterator[TaskSpec]:
    """One task per non-empty line of a JSONL file."""
    p = Path(path)
    try:
        f = open(p, encoding="utf-8")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise SourceError(f"cannot open dataset {p}: {e.strerror}") from None
    with f:
        index = 0
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})"
                                  ) from None
            yield row_to_spec(row, where=where, index=index, dataset=dataset, fields=fields)
            index += 1


def read_parquet(path: str | Path, *, dataset: str, fields: Any,
                 batch_size: int = 1024) -> Iterator[TaskSpec]:
    """One task per row of a Parquet file (read in batches; needs pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError("reading Parquet needs pyarrow: pip install 'astraflow[parquet]'") from None
    p = Path(path)
    try:
        pf = pq.ParquetFile(p)
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot read Parquet file {p}: {e}") from None
    index = 0
    for batch in pf.iter_batches(batch_size=batch_size):
        for row in batch.to_pylist():
            yield row_to_spec(row, where=f"{p} row {index}", index=index, dataset=dataset,
                              fields=fields)
            index += 1
