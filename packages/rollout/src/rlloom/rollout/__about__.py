"""Version of this distribution, bumped by `nox -s release`."""

__version__ = "0.1.0"
