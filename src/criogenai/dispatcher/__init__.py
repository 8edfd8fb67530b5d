"""The dispatcher side: validate a turn, fan it out, gather its results."""

from ._dispatcher import Dispatcher

__all__ = ["Dispatcher"]
