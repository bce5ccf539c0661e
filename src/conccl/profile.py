"""TEMPORARY: the hardware profile moved to :mod:`conccl.planner.profile`; this name stays only
until cli.py (being split into cli/) imports it from there. Remove with that change."""
from .planner.profile import EMBEDDED, FORMAT, HardwareProfile, ProfileError, load_profile  # noqa: F401
