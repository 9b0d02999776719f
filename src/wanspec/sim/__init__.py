"""Drivers for the sans-IO protocols: the discrete-event simulator and its link/compute models."""

from wanspec.sim.driver import simulate
from wanspec.sim.link import LINK_PRESETS, Channel, Link, Transmission, link_preset
from wanspec.sim.many import BatchPass, EdgeSession, ManyResult, simulate_many
from wanspec.sim.profiles import (
    Curve,
    MeasuredProfile,
    Profile,
    TableProfile,
    available_profiles,
    batch_seconds,
    load_profile,
    profile_from_dict,
)
from wanspec.sim.request import (
    EmitRecord,
    SimResult,
    SimulationDeadlock,
    SimulationError,
    SimulationTimeout,
    TraceRecord,
)

__all__ = [
    "LINK_PRESETS",
    "BatchPass",
    "Channel",
    "Curve",
    "EdgeSession",
    "EmitRecord",
    "Link",
    "ManyResult",
    "MeasuredProfile",
    "Profile",
    "SimResult",
    "SimulationDeadlock",
    "SimulationError",
    "SimulationTimeout",
    "TableProfile",
    "TraceRecord",
    "Transmission",
    "available_profiles",
    "batch_seconds",
    "link_preset",
    "load_profile",
    "profile_from_dict",
    "simulate",
    "simulate_many",
]
