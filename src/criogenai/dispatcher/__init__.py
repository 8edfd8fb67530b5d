"""The dispatcher side: validate a turn, fan it out, gather its results."""

from ._approvals import (
    ApprovalConflict,
    ApprovalNotFound,
    Approvals,
    InvalidApprovalArguments,
    PendingApproval,
)
from ._dispatcher import Dispatcher
from ._hooks import AfterHook, Allow, Answer, BeforeHook, Block, ChangeArguments, HookCall, ResultCache

__all__ = [
    "AfterHook",
    "Allow",
    "Answer",
    "ApprovalConflict",
    "ApprovalNotFound",
    "Approvals",
    "BeforeHook",
    "Block",
    "ChangeArguments",
    "Dispatcher",
    "HookCall",
    "InvalidApprovalArguments",
    "PendingApproval",
    "ResultCache",
]
