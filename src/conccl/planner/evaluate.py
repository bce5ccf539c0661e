"""TEMPORARY: the planner's evaluation against a study moved to :mod:`conccl.study.evaluate`
(the planner never reads a study's results); this name stays only until planner/command.py
moves to cli/plan.py and imports it from there. Remove with that change."""
from ..study.evaluate import evaluate, markdown  # noqa: F401
