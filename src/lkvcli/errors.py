"""The one exception type the CLI turns into a single clear line."""


class LkvError(Exception):
    """A user-facing error: the message names the problem and the fix."""
