"""Numeric CSV files as arrays: MagmaDNN's `read_csv_to_tensor`, with an optional label column.

Parsing uses NumPy's C reader (fast enough for tens of MB); when it refuses
the input, a second, slower pass finds the first bad line and column so that
the error says exactly where the file is wrong. Non-finite values (nan, inf)
are refused too: they are never what a data file means to hold.
"""
import csv

import numpy as np

from .errors import DataError
from .files import checked_path, read_bytes

_DTYPES = ("float16", "float32", "float64")


def _fields(line, delimiter):
    """A line's fields, split with the quoting rules of the data's reader (a quoted delimiter is
    inside its field)."""
    return [f.strip() for f in next(csv.reader([line], delimiter=delimiter, quotechar='"'))]


def _is_number(text):
    """Whether NumPy's reader takes `text` as a number: Python's float() takes digits grouped by
    underscores ('1_000') as well, which NumPy refuses (the error then fell back to NumPy's own
    message, with a 0-based row)."""
    if "_" in text:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_problem(rows, delimiter, what):
    """A DataError naming the first line that is not a row of numbers like the first one."""
    width = None
    for lineno, line in rows:
        fields = _fields(line, delimiter)
        if width is None:
            width = (lineno, len(fields))
        elif len(fields) != width[1]:
            return DataError(f"{what}: line {lineno} has {len(fields)} fields, line {width[0]} has {width[1]}")
        for col, f in enumerate(fields):
            if not _is_number(f):
                return DataError(f"{what}: line {lineno}, column {col}: {f!r} is not a number")
    return None


def parse_csv(text, what="CSV data", label_column=None, delimiter=",", header="auto", dtype="float32"):
    """(x, y) from CSV text; see read_csv."""
    if dtype not in _DTYPES:
        raise DataError(f"{what}: dtype must be one of {_DTYPES}, got {dtype!r}")
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"':
        raise DataError(f"{what}: delimiter must be one character (not a quote or a line break), "
                        f"got {delimiter!r}")
    if header not in ("auto", True, False) or type(header) not in (str, bool):
        raise DataError(f"{what}: header must be 'auto', True or False, got {header!r}")
    if text.startswith("\ufeff"):       # a byte-order mark (see read_csv)
        text = text[1:]
    rows = [(k + 1, line) for k, line in enumerate(text.splitlines()) if line.strip()]
    if not rows:
        raise DataError(f"{what}: no data")
    for lineno, line in rows:
        # a line of an odd number of quotes opens a field it does not close: NumPy's reader then joined
        # it to the next line ("2<newline>3" read as the number 23): no numeric field spans lines
        if line.count('"') % 2:
            raise DataError(f"{what}: line {lineno} has an unterminated quote (a quoted field may not span "
                            f"lines)")
    names = None
    if header == "auto":
        header = _auto_header(rows[0], delimiter, what)
    if header:
        names = _fields(rows[0][1], delimiter)
        rows = rows[1:]
        if not rows:
            raise DataError(f"{what}: a header line but no data")
    try:
        data = np.loadtxt([line for _, line in rows], delimiter=delimiter, dtype=np.float64, ndmin=2,
                          comments=None, quotechar='"')
    except ValueError as exc:
        raise (_first_problem(rows, delimiter, what) or DataError(f"{what}: {exc}")) from exc
    bad = np.argwhere(~np.isfinite(data))
    if bad.size:
        r, c = bad[0]
        # (the token as written: '1e400' overflows float64 to inf, and "non-finite value inf" hid which)
        token = _fields(rows[r][1], delimiter)[c]
        why = " (beyond float64's range)" if np.isinf(data[r, c]) and "inf" not in token.lower() else ""
        raise DataError(f"{what}: line {rows[r][0]}, column {c}: non-finite value {token!r}{why}")
    if names is not None and len(names) != data.shape[1]:
        raise DataError(f"{what}: the header names {len(names)} column(s), the data rows have {data.shape[1]}")
    if label_column is None:
        return _narrowed(data, dtype, rows, what), None
    col = _label_index(label_column, names, data.shape[1], what)
    labels = data[:, col]
    wrong = np.flatnonzero((labels != np.round(labels)) | (labels < 0) | (labels > _LABEL_MAX))
    if wrong.size:
        k = wrong[0]
        raise DataError(f"{what}: line {rows[k][0]}: label {labels[k]:g} in column {col} is not a "
                        f"non-negative integer up to 2**53 (a class index)")
    return _narrowed(np.delete(data, col, axis=1), dtype, rows, what), labels.astype(np.int64)


#: the largest label read exactly (float64 holds every integer up to 2**53; int64 would wrap beyond 2**63)
_LABEL_MAX = 2.0 ** 53


def _auto_header(first, delimiter, what):
    """header='auto': a first line of names only is a header, of numbers only is data; a mix is refused
    (a data row with a typo would otherwise be dropped as a header without a word)."""
    lineno, line = first
    numeric = [_is_number(f) for f in _fields(line, delimiter)]
    if all(numeric):
        return False
    if not any(numeric):
        return True
    col = numeric.index(False)
    raise DataError(f"{what}: line {lineno} mixes numbers and text (column {col}: "
                    f"{_fields(line, delimiter)[col]!r}), so it is neither clearly a header nor data: fix "
                    f"the value, or pass header=True (or False)")


def _narrowed(data, dtype, rows, what):
    """`data` (float64) as `dtype`, refusing values that it turns into infinity."""
    big = np.argwhere(np.abs(data) > np.finfo(dtype).max)
    if big.size:
        r, c = big[0]
        raise DataError(f"{what}: line {rows[r][0]}, column {c}: {data[r, c]:g} exceeds {dtype}'s range "
                        f"(+-{np.finfo(dtype).max:g}); read it with dtype='float64' or scale the data")
    return data.astype(dtype)


def _label_index(label_column, names, width, what):
    if isinstance(label_column, str):
        if names is None or label_column not in names:
            raise DataError(f"{what}: no column named {label_column!r} in the header {names}")
        return names.index(label_column)
    if isinstance(label_column, bool) or not isinstance(label_column, (int, np.integer)):
        raise DataError(f"{what}: label_column must be a column index or a header name, got {label_column!r}")
    if not -width <= label_column < width:
        raise DataError(f"{what}: label_column {label_column} is outside the {width} columns")
    return int(label_column) % width


def read_csv(path, label_column=None, delimiter=",", header="auto", dtype="float32"):
    """Read a numeric CSV file (optionally gzip-compressed) into (x, y).

    label_column: None (y is None, x holds every column), a column index
    (negative counts from the end) or a header name: that column becomes the
    int64 labels y (non-negative integers) and x the other columns.
    header: 'auto' (the first line is a header when it is not all numbers),
    True or False. dtype: x's dtype. Blank lines are skipped. Raises
    DataError for a missing file, an empty file, a non-numeric or
    non-finite value, rows of different lengths, or a bad label, and for
    what is not a regular file (a FIFO, a directory) or does not fit in
    memory; ConfigError for a path that is not a str or os.PathLike.
    """
    path = checked_path(path, "read_csv")
    raw = read_bytes(path)
    try:
        # (utf-8-sig: a byte-order mark, as spreadsheet programs write, is no part of the first field: it
        # made a first data row "mixed" and the first header name unfindable by label_column)
        text = raw.decode("utf-8-sig")
        return parse_csv(text, path, label_column, delimiter, header, dtype)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a text file ({exc})") from exc
    except MemoryError as exc:
        # (the text, its lines and the float64 parse take several times the file's bytes: a file that
        # fits in memory may still not parse there)
        raise DataError(f"{path}: not enough memory to read its {len(raw):,} bytes as CSV (the parse needs "
                        f"several times that): split the file, or read it in parts") from exc
