"""The run directory's tables read back (the report, the heatmap and the cost table read through these).

Contract: `read_dataset(path, columns, status)` reads a Parquet dataset (one file or a directory of parts) and
raises one line naming what is missing or damaged; `count_rows` and `has_column` ask the files' metadata. A
damaged run directory is a RunDirectoryError naming its path (`_run_error`); an exception's message is cut to its
first line (`_one_line`). Imports no torch.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from ..errors import RunDirectoryError


def _run_error(path: Path, what: str) -> RunDirectoryError:
    return RunDirectoryError(f"{path}: {what}")

def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


PART = "__part"  # a column read_dataset adds on request: each row's part file name ("" for a single-file table)


def read_dataset(path: Path, columns: list[str], status: str, filter=None) -> pa.Table:
    """A Parquet dataset path (one file or a directory of parts; dot-prefixed files are skipped). The column
    PART, when asked for, is a dictionary column of the part file names, read as the scanner's fragment index."""
    if not path.exists():
        raise _run_error(path, "missing; the run directory is incomplete (re-run `mtp-observe replay`)")
    try:
        dataset = pads.dataset(str(path), format="parquet")
        if not dataset.files:
            raise _run_error(path, f"holds no Parquet parts (run status: {status}); nothing has been written yet")
        missing = [c for c in columns if c not in dataset.schema.names and c != PART]
        if missing:
            raise _run_error(path, f"has no column(s) {', '.join(missing)}; it was not written with this run's "
                                   "schema (re-run replay)")
        if PART not in columns:
            return dataset.to_table(columns=columns, filter=filter)
        table = dataset.to_table(columns=[c if c != PART else "__fragment_index" for c in columns], filter=filter)
        names = [Path(f).name for f in dataset.files] if path.is_dir() else [""] * len(dataset.files)
        index = table.column("__fragment_index").combine_chunks()
        parts = pa.DictionaryArray.from_arrays(index, pa.array(names, pa.string()))
        return table.set_column(table.schema.get_field_index("__fragment_index"), PART, parts)
    except (pa.ArrowException, OSError) as e:
        raise _run_error(path, f"cannot be read as Parquet ({_one_line(e)}); the run directory is damaged") from None


def count_rows(path: Path) -> int:
    """Rows of a Parquet dataset (every drafter's), from the files' metadata."""
    try:
        return int(pads.dataset(str(path), format="parquet").count_rows())
    except (pa.ArrowException, OSError) as e:
        raise _run_error(path, f"cannot be read as Parquet ({_one_line(e)}); the run directory is damaged") from None


def has_column(path: Path, name: str) -> bool:
    """Whether a Parquet dataset path has a column (False where it cannot be read: read_dataset says why)."""
    try:
        return name in pads.dataset(str(path), format="parquet").schema.names
    except (pa.ArrowException, OSError):
        return False
