"""The root of every expected failure.

A :class:`FedperError` is a failure the user can act on (a bad option, a bad input file, a
server that refuses or cannot be reached); its message names what is wrong and what was
expected, and the command line prints it as one line. Any other exception is a bug and keeps
its traceback. Subclasses also derive from the builtin that fits (``ValueError``,
``RuntimeError``), so callers that catch those keep working.
"""

from __future__ import annotations


class FedperError(Exception):
    """An expected failure, explained by its message."""


class ConfigError(FedperError, ValueError):
    """Options that cannot work (alone or together); the message names the option."""
