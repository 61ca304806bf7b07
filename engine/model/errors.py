"""The loader's error, apart so that what the loader calls (engine/model/fp8.py) can raise it too."""


class LoadError(ValueError):
    """A model source that cannot be loaded; the message names the problem."""
