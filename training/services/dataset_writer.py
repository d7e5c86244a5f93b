"""A GRPO dataset's files: train/validation as Parquet and JSON Lines, written a batch of groups at a
time by a thread of their own, and hashed as they are written."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BATCH = 250  # groups per write (a group is some 20 KB of JSON with 8 samples): memory stays flat

json_text = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(x, ensure_ascii=False), one encoder


def parquet_schema() -> Any:
    """The files' columns (TRL conversational: `prompt` is a list of messages)."""
    import pyarrow as pa  # pyarrow: slow to import; only a dataset build needs it

    return pa.schema(
        [
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("item", pa.string()),
            ("task_id", pa.string()),
            ("domain", pa.string()),
            ("reference", pa.string()),
            ("scorer", pa.string()),
            ("group_completions", pa.list_(pa.string())),
            ("rewards", pa.list_(pa.float64())),
            ("advantages", pa.list_(pa.float64())),
            ("scores", pa.list_(pa.float64())),
            ("parsed", pa.list_(pa.bool_())),
            ("costs_usd", pa.list_(pa.string())),
            ("run_ids", pa.list_(pa.int64())),
        ]
    )


@dataclass
class Group:
    """One row of the files, its columns in order: the prompt's JSON (see dataset_groups.Prompts), the task's
    columns, the plans (`group_completions`) each as a JSON string in UTF-8 (see dataset_groups.PlanBytes), and the
    samples' columns."""

    prompt_json: str
    task: dict[str, Any]
    completions_json: list[bytes]
    samples: dict[str, Any]

    def line(self) -> list[bytes]:
        """The JSON line in UTF-8, as json.dumps writes the row (ensure_ascii=False), in parts: the
        batch's lines are joined in one go (each plan copied once)."""
        parts = [
            f'{{"prompt": {self.prompt_json}, {json_text(self.task)[1:-1]}, "group_completions": ['.encode()
        ]
        for plan in self.completions_json:
            parts += (plan, b", ")
        if self.completions_json:
            parts.pop()  # no comma after the last
        parts.append(f"], {json_text(self.samples)[1:]}\n".encode())
        return parts


class GroupFiles:
    """train/validation as Parquet and JSON Lines, written `batch` groups at a time by one writer thread
    (while the build reads the next rows: the writes, hashing, JSON parsing and Parquet encoding leave
    the GIL; one batch is written while the next fills, so memory stays at two batches). The JSON Lines
    are hashed as they are written, and parsed by Arrow into the Parquet rows."""

    SPLITS = ("train", "validation")

    def __init__(self, directory: Path):
        self.directory = directory
        self.batch = BATCH
        self.rows = dict.fromkeys(self.SPLITS, 0)
        self._pending: dict[str, list[Group]] = {split: [] for split in self.SPLITS}
        self._digest = hashlib.sha256()  # of train.jsonl; validation.jsonl is read back at the end
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataset-files")
        self._writing: Future[None] | None = None

    def __enter__(self) -> GroupFiles:
        import pyarrow.parquet as pq  # pyarrow: slow to import; only a dataset build needs it

        self.directory.mkdir(parents=True, exist_ok=True)
        self._schema = parquet_schema()
        self._parquet = {
            s: pq.ParquetWriter(self.directory / f"{s}.parquet", self._schema) for s in self.SPLITS
        }
        self._jsonl = {s: (self.directory / f"{s}.jsonl").open("wb") for s in self.SPLITS}
        return self

    def add(self, split: str, group: Group) -> None:
        self._pending[split].append(group)
        self.rows[split] += 1
        if len(self._pending[split]) >= self.batch:
            self._write(split)

    def _write(self, split: str) -> None:
        groups, self._pending[split] = self._pending[split], []
        if not groups:
            return
        self._wait()
        self._writing = self._writer.submit(self._write_groups, split, groups)

    def _wait(self) -> None:
        """The batch being written is written (its error raised here)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _write_groups(self, split: str, groups: list[Group]) -> None:
        text = b"".join([part for group in groups for part in group.line()])
        self._jsonl[split].write(text)
        if split == self.SPLITS[0]:
            self._digest.update(text)
        self._parquet[split].write_table(self._parsed(text))

    def _parsed(self, text: bytes) -> Any:
        """The lines as an Arrow table, parsed by Arrow (no Python object per value, the GIL left):
        the Parquet rows are the JSON Lines' rows by construction."""
        # pyarrow: slow to import; only a dataset build needs it
        import pyarrow as pa
        import pyarrow.json as pj

        return pj.read_json(
            pa.BufferReader(text),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(text) + 1),
            parse_options=pj.ParseOptions(explicit_schema=self._schema, unexpected_field_behavior="error"),
        )

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                for split in self.SPLITS:
                    self._write(split)
            self._wait()
        finally:
            self._writer.shutdown()
            for split in self.SPLITS:
                self._jsonl[split].close()
                self._parquet[split].close()

    def content_hash(self) -> str:
        """sha256 over train.jsonl, then validation.jsonl."""
        digest = self._digest.copy()
        for split in self.SPLITS[1:]:
            with (self.directory / f"{split}.jsonl").open("rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
        return digest.hexdigest()
