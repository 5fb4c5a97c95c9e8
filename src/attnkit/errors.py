"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the one place that
turns the operating system's and the file formats' errors into such lines (:func:`describe`)."""

from __future__ import annotations

import errno

REPORT_BUGS = "attnkit's issue tracker (run again with ATTNKIT_DEBUG=1 and include the traceback)"


class AttnkitError(Exception):
    """A user-facing error: the message says what is wrong and where (file, line, key)."""


class RequestError(AttnkitError):
    """A request's fault found below the server (by an input kind): the HTTP status it is answered with (422 a
    wrong value, 413 too large) and the one line naming the field."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def environment_choice(environ, variable: str, choices: tuple[str, ...], error: type[Exception] = ValueError) -> str:
    """The value of ``variable`` in ``environ``, one of ``choices`` (the first when it is not set); else ``error``
    naming the variable, its value and the choices."""
    value = environ.get(variable, choices[0])
    if value not in choices:
        raise error(f"{variable}={value!r}: expected one of {', '.join(choices)}")
    return value


def describe_os_error(e: OSError, what: str | None = None) -> str:
    """One line for an OSError: the path it concerns (``what`` when the error carries none) and what is wrong."""
    where = e.filename if e.filename is not None else what
    if getattr(e, "filename2", None) is not None:
        where = f"{where} -> {e.filename2}"
    if isinstance(e, FileNotFoundError):
        problem = "no such file or directory"
    elif isinstance(e, IsADirectoryError):
        problem = "is a directory, where a file is expected"
    elif isinstance(e, NotADirectoryError):
        problem = "not a directory (a part of the path is a file)"
    elif isinstance(e, PermissionError):
        problem = "permission denied"
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        problem = "no space left on the device (disk full); nothing written before is lost"
    elif e.errno == errno.EROFS:
        problem = "read-only file system"
    else:
        problem = e.strerror or str(e) or type(e).__name__
    return f"{where}: {problem}" if where else problem


def describe(e: BaseException) -> str | None:
    """One line for an error that is the user's or the machine's, not attnkit's (None: it is a bug)."""
    import gzip
    import zipfile
    import zlib

    if isinstance(e, AttnkitError):
        return str(e)
    if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile):
        return describe_os_error(e)
    if isinstance(e, (gzip.BadGzipFile, zlib.error)) or (isinstance(e, EOFError) and "end-of-stream" in str(e)):
        return f"a broken or truncated gzip file ({e})"
    if isinstance(e, zipfile.BadZipFile):
        return f"a broken zip file ({e})"
    if isinstance(e, UnicodeDecodeError):
        return f"text that is not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if isinstance(e, MemoryError):
        return "out of memory"
    return None
