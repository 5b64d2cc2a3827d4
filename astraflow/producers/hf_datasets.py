"""Hugging Face ``datasets`` as a task source (``source: hf_datasets``), from local disk only.

``producer.hf_datasets.path`` is a folder written by ``Dataset.save_to_disk`` /
``DatasetDict.save_to_disk`` (read with ``datasets.load_from_disk``) or one data file; or
``data_files`` names local files (one, a list, or ``split -> files``) read with the packaged
``json`` / ``csv`` / ``parquet`` loader. A hub is never reached: the loaders are local and the
library's offline switch is on while they run. Rows become tasks through ``producer.fields``
(:func:`~astraflow.producers.sources.row_to_spec`); row ids default to
``<dataset>/<split>:<row>``.
"""

from __future__ import annotations

import contextlib
import glob
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from astraflow.core.paths import expand
from astraflow.producers.sources import SourceError, TaskSpec, row_to_spec

INSTALL = "pip install 'astraflow[datasets]'"
_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise SourceError(f"producer.source=hf_datasets needs the datasets library: {INSTALL}"
                          ) from None
    return datasets


@contextlib.contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """The library's offline switch on (it reads HF_DATASETS_OFFLINE once, at import) and its
    progress bars off, for the duration."""
    cfg = datasets.config
    saved = (cfg.HF_HUB_OFFLINE, getattr(cfg, "HF_DATASETS_OFFLINE", None))
    bars = datasets.utils.are_progress_bars_disabled()
    cfg.HF_HUB_OFFLINE = True
    cfg.HF_DATASETS_OFFLINE = True
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        cfg.HF_HUB_OFFLINE, cfg.HF_DATASETS_OFFLINE = saved
        if not bars:
            datasets.enable_progress_bars()


def _files(value: Any, out: str | Path) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    return [expand(str(v), out=out) for v in items]


def _check_files(files: list[str], key: str) -> None:
    for f in files:
        if not glob.has_magic(f) and not Path(f).is_file():
            raise SourceError(f"{key}: data file {f} does not exist")


def _format(hc: Any, files: list[str]) -> str:
    if hc.format:
        return str(hc.format)
    suffix = Path(files[0]).suffix.lower() if files else ""
    if suffix not in _FORMATS:
        raise SourceError(f"producer.hf_datasets.format: cannot tell the format of {files[0]!r} "
                          f"from its extension; set it to json, csv or parquet")
    return _FORMATS[suffix]


def load_splits(hc: Any, out: str | Path = ".") -> dict[str, Any]:
    """Split name -> ``datasets.Dataset`` of the configured source (``producer.hf_datasets``)."""
    if hc.path is None and hc.data_files is None:
        raise SourceError("producer.source=hf_datasets needs producer.hf_datasets.path (a folder "
                          "written by save_to_disk, or a data file) or "
                          "producer.hf_datasets.data_files")
    datasets = _datasets()
    data_files: dict[str, list[str]]
    if hc.data_files is not None:
        if isinstance(hc.data_files, Mapping):
            data_files = {str(k): _files(v, out) for k, v in hc.data_files.items()}
        else:
            data_files = {hc.split: _files(hc.data_files, out)}
        for files in data_files.values():
            _check_files(files, "producer.hf_datasets.data_files")
    else:
        path = Path(expand(hc.path, out=out))
        if not path.exists():
            raise SourceError(f"producer.hf_datasets.path: {path} does not exist (a folder "
                              "written by Dataset.save_to_disk / DatasetDict.save_to_disk, or "
                              "a data file)")
        if path.is_dir():
            with _offline(datasets):
                try:
                    loaded = datasets.load_from_disk(str(path))
                except FileNotFoundError as e:
                    raise SourceError(f"producer.hf_datasets.path: {path} is not a saved "
                                      f"dataset ({e}); write it with save_to_disk, or name "
                                      "data files with producer.hf_datasets.data_files") from None
            if isinstance(loaded, Mapping):  # a DatasetDict
                return dict(loaded)
            return {hc.split: loaded}
        data_files = {hc.split: [str(path)]}
    fmt = _format(hc, next(iter(data_files.values())))
    cache = expand(hc.cache_dir, out=out) if hc.cache_dir else None
    with _offline(datasets):
        try:
            loaded = datasets.load_dataset(fmt, data_files=data_files, cache_dir=cache)
        except (FileNotFoundError, ValueError) as e:
            raise SourceError(f"producer.hf_datasets: cannot read {data_files} as {fmt}: {e}"
                              ) from None
    return dict(loaded)


def rows(ds: Any, *, label: str, dataset: str, fields: Any) -> Iterator[TaskSpec]:
    """The tasks of one loaded split (``label`` names it in errors)."""
    for i, row in enumerate(ds):
        yield row_to_spec(row, where=f"{label} row {i}", index=i, dataset=dataset,
                          fields=fields)


def source_label(hc: Any) -> str:
    """A short name for the source: the folder's or file's stem; for data files named by split
    (``gsm8k/train.jsonl``), their folder's name."""
    if hc.path is not None:
        return Path(hc.path).stem or "hf_datasets"
    files = hc.data_files
    splits: list[str] = []
    if isinstance(files, Mapping):
        splits = [str(k) for k in files]
        files = next(iter(files.values()), "")
    first = Path(files if isinstance(files, str) else (list(files) or [""])[0])
    if first.stem in splits and first.parent.name not in ("", "{out}"):
        return first.parent.name
    return first.stem or "hf_datasets"
