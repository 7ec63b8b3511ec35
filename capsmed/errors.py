"""The one exception type users see: a one-line message naming the file and the problem."""


class CapsmedError(Exception):
    """A problem with the user's input or environment, reported as one line.

    The CLI prints ``error: <message>`` and exits non-zero; library callers can catch it.
    Messages name the offending file first, e.g. ``"data/x.h5: not an HDF5 file"``.
    """
