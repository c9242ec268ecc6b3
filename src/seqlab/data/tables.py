"""Tables as pandas writes them: CSV (`data=csv`) and Parquet (`data=parquet`), one sample per row.

A row holds seq_len * features input values (step-major) and the target. What pandas adds is
taken for what it is, never for a feature:
- `df.to_csv()` writes the frame's index as the first column: unnamed (pandas' default integer
  index) or named (a `date` column of daily data). index_col=auto takes an unnamed first column,
  or a first column of dates, as the index and drops it; the data line says which.
- `df.to_parquet()` keeps the index in the file's pandas metadata: it comes back as the index.
The target is a named column (`data.source.target`, default: the last). A feature column that is
not numeric is refused in one line naming it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import numpy as np
import pandas as pd

from seqlab import SeqlabError
from seqlab.data.sources import SeqData, as_sequences

if TYPE_CHECKING:
    import pandas as pd

AUTO = "auto"


def load_csv(
    path: str,
    n_samples: Optional[int],
    seed: int,
    seq_len: int = 1,
    header: Union[str, bool] = AUTO,
    delimiter: str = ",",
    target: Optional[str] = None,
    index_col: Union[str, bool, None] = AUTO,
) -> SeqData:
    """header=auto: the first row names the columns unless every cell of it is a number."""

    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except UnicodeDecodeError:
        raise SeqlabError(f"{path}: not a text CSV file") from None
    except FileNotFoundError:
        raise SeqlabError(f"{path}: no such file; set data.path") from None
    if not first.strip():
        raise SeqlabError(f"{path}: the file is empty")
    if header == AUTO:
        header = not all(_is_number(cell) for cell in first.rstrip("\r\n").split(delimiter))
    try:
        frame = pd.read_csv(
            path, sep=delimiter, header=0 if header else None, skip_blank_lines=True
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise SeqlabError(f"{path}: not a CSV table ({' '.join(str(error).split())})") from None
    if not header:
        frame.columns = [str(c) for c in frame.columns]
    unnamed = bool(header) and str(frame.columns[0]).startswith(
        "Unnamed: 0"
    )  # pandas' name for an empty header cell
    return _from_frame(
        frame,
        path,
        n_samples,
        seq_len,
        target,
        index_col,
        unnamed_first=unnamed,
        first_row=2 if header else 1,
    )


def load_parquet(
    path: str,
    n_samples: Optional[int],
    seed: int,
    seq_len: int = 1,
    target: Optional[str] = None,
    index_col: Union[str, bool, None] = AUTO,
) -> SeqData:
    """A Parquet file (pyarrow): pandas' index comes back as the index, the rest are columns."""

    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise SeqlabError(f"{path}: no such file; set data.path") from None
    except Exception as error:  # noqa: BLE001 - pyarrow's errors have no common base worth naming
        raise SeqlabError(
            f"{path}: not a Parquet file ({' '.join(str(error).split())[:200]})"
        ) from None
    note = (
        None
        if isinstance(frame.index, pd.RangeIndex)
        else f"index {_name(frame.index.name)} (pandas' index: not a feature)"
    )
    frame.columns = [str(c) for c in frame.columns]
    return _from_frame(
        frame.reset_index(drop=True), path, n_samples, seq_len, target, index_col, index_note=note
    )


def _from_frame(
    frame: pd.DataFrame,
    path: str,
    n_samples: Optional[int],
    seq_len: int,
    target: Optional[str],
    index_col: Union[str, bool, None],
    *,
    unnamed_first: bool = False,
    first_row: int = 1,
    index_note: Optional[str] = None,
) -> SeqData:

    if frame.empty:
        raise SeqlabError(f"{path}: the table has no rows")
    notes = [index_note] if index_note else []
    index = _index_column(frame, path, index_col, unnamed_first)
    if index is not None:
        notes.append(f"index {_name(index)} (dropped)")
        frame = frame.drop(columns=[index])
    target = target if target is not None else str(frame.columns[-1])
    if target not in frame.columns:
        shown = ", ".join(map(str, frame.columns[:8])) + (", ..." if len(frame.columns) > 8 else "")
        raise SeqlabError(
            f"{path}: data.source.target={target!r} is not a column (columns: {shown})"
        )
    notes.append(f"target {_name(target)}")
    features = frame.drop(columns=[target])
    for name in [*features.columns, target]:
        column = frame[name]
        if not pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            bad = column[pd.to_numeric(column, errors="coerce").isna() & column.notna()]
            where = (
                f"{path}:{bad.index[0] + first_row}: not a number: {str(bad.iloc[0]).strip()!r} in"
                if len(bad)
                else f"{path}:"
            )
            raise SeqlabError(
                f"{where} column {_name(name)}, which is not numeric: drop it, make it the index "
                "(data.source.index_col=...), or encode it as numbers"
            )
    n_inputs = features.shape[1]
    if n_inputs < 1 or n_inputs % seq_len:
        raise SeqlabError(
            f"{path}: {n_inputs} input columns cannot be split into data.source.seq_len={seq_len} steps"
        )
    x = features.to_numpy(dtype=np.float32).reshape(len(frame), seq_len, n_inputs // seq_len)
    data = as_sequences(x, frame[target].to_numpy(dtype=np.float32), path).first(n_samples)
    data.columns = ", ".join(notes)
    return data


def _index_column(
    frame: pd.DataFrame, path: str, index_col: Union[str, bool, None], unnamed_first: bool
) -> Optional[str]:
    """Which column is the index: the one named, none (null/false), or auto: an unnamed first
    column (how pandas writes its index) or a first column of dates."""

    if index_col in (None, False):
        return None
    if index_col != AUTO:
        if str(index_col) not in frame.columns:
            raise SeqlabError(
                f"{path}: data.source.index_col={index_col!r} is not a column "
                f"(columns: {', '.join(map(str, frame.columns[:8]))}{', ...' if len(frame.columns) > 8 else ''})"
            )
        return str(index_col)
    first = frame.columns[0]
    if unnamed_first:
        return first
    column = frame[first]
    if pd.api.types.is_datetime64_any_dtype(column):
        return first
    if pd.api.types.is_string_dtype(column) or column.dtype == object:  # pandas 3 reads text as str
        with np.errstate(all="ignore"):
            dates = pd.to_datetime(column, errors="coerce", format="mixed")
        if dates.notna().all():
            return first
    return None


def _name(name: object) -> str:
    return "(unnamed)" if name is None or str(name).startswith("Unnamed: ") else repr(str(name))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
