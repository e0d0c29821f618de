"""The error every dnn.data reader raises for input it cannot trust."""
from ..errors import DNNError


class DataError(DNNError, ValueError):
    """A data file or array is missing, truncated, corrupt or not what the reader expects
    (bad magic number, sizes that do not match the header, non-numeric values, bad labels).

    Readers raise it instead of returning partly read or garbage data.
    """
