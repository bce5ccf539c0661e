"""One :class:`Group` per process group: the state conccl keeps for it, closed in one call."""
from .group import DEFAULT_TIMEOUT, Group, Options, board_row_len

__all__ = ["Group", "Options", "DEFAULT_TIMEOUT", "board_row_len"]
