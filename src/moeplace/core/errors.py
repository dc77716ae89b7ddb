"""The one error type users see: a sentence naming the file or field and what to do."""


class MoeplaceError(Exception):
    """A user-facing failure. The CLI prints its message as one line and exits non-zero."""
