"""Every `wanspec bench` experiment, assembled once, in the order `wanspec bench list` shows.

The experiment modules only define plain lists; this module alone gathers them, so their order
is stated in one place, and a name taken twice fails at import instead of one experiment
silently hiding another. The result is read-only: nothing registers itself later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from wanspec.bench import acespec, capacity, linksweep, xcosd
from wanspec.bench.experiment import Experiment


@dataclass(frozen=True)
class Source:
    """One experiment module's part: its experiments, in order, and their other command names."""

    module: str
    experiments: Sequence[Experiment]
    aliases: Mapping[str, str] = field(default_factory=dict)  # alias -> experiment name


# the order of `wanspec bench list`, of its commands and of the report: X-CoSD, AceSpec, capacity,
# the link sweep
SOURCES: tuple[Source, ...] = (
    Source(xcosd.__name__, xcosd.XCOSD_EXPERIMENTS),
    Source(acespec.__name__, acespec.ACESPEC_EXPERIMENTS, acespec.ACESPEC_ALIASES),
    Source(capacity.__name__, capacity.CAPACITY_EXPERIMENTS),
    Source(linksweep.__name__, linksweep.LINK_EXPERIMENTS),
)


def build(sources: Sequence[Source]) -> tuple[dict[str, Experiment], dict[str, str]]:
    """The experiments by name and the aliases of `sources`, in their order.

    Raises ValueError when a name or alias is taken twice or an alias names no experiment."""
    experiments: dict[str, Experiment] = {}
    owners: dict[str, str] = {}  # every name and alias taken so far -> the module that took it
    for source in sources:
        for experiment in source.experiments:
            _claim(experiment.name, source.module, owners)
            experiments[experiment.name] = experiment
    aliases: dict[str, str] = {}
    for source in sources:  # after every experiment: an alias may name another module's
        for alias, name in source.aliases.items():
            _claim(alias, source.module, owners)
            if name not in experiments:
                raise ValueError(f"{source.module}: alias {alias!r} names no experiment ({name!r})")
            aliases[alias] = name
    return experiments, aliases


def _claim(name: str, module: str, owners: dict[str, str]) -> None:
    """Record that `module` defines `name`; a second definition is an error, not an override."""
    if name in owners:
        where = owners[name] if owners[name] == module else f"{owners[name]} and {module}"
        raise ValueError(f"experiment name {name!r} is defined twice (in {where})")
    owners[name] = module


_experiments, _aliases = build(SOURCES)
EXPERIMENTS: Mapping[str, Experiment] = MappingProxyType(_experiments)
ALIASES: Mapping[str, str] = MappingProxyType(_aliases)


def get_experiment(name: str) -> Experiment:
    """The experiment called `name`, or aliased so; an unknown name lists the known ones."""
    name = ALIASES.get(name, name)
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]
