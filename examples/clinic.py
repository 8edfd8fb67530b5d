"""The Tools page's clinic tools, as ``examples.clinic`` (they live in ``criogenai.demo``)."""

from criogenai.demo import SENT, Address, get_lab_result, lab_system_is_down, schedule_visit, send

__all__ = ["SENT", "Address", "get_lab_result", "lab_system_is_down", "schedule_visit", "send"]
