"""The one exception type the CLI turns into a single readable line (no traceback)."""


class MapsTrainError(Exception):
    """A user-facing error: bad input, bad recipe, missing file, unreachable service.

    The message must fit on one line and name the file, line or field at fault.
    """


class ConfigError(MapsTrainError):
    """A recipe that does not match its dataclass: unknown key, wrong type, missing file."""
