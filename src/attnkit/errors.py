"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class AttnkitError(Exception):
    """A user-facing error: the message says what is wrong and where (file, line, key)."""
