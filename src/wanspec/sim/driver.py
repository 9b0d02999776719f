"""`simulate`: one request on the simulator, the one session of a cloud of its own.

It is `simulate_many` (`wanspec.sim.many`, the simulator's one event loop) with a single session
and every prompt in one pass: alone, a cloud job starts the moment it may and is priced by the
cloud profile on its own. What a request does and costs: `wanspec.sim.request`.
"""

from __future__ import annotations

from wanspec.jobs import Executor
from wanspec.protocols.base import StateMachine
from wanspec.sim.link import Link
from wanspec.sim.many import EdgeSession, simulate_many
from wanspec.sim.profiles import Profile
from wanspec.sim.request import SimResult, SizeFn


def simulate(
    edge: StateMachine,
    cloud: StateMachine,
    link: Link,
    edge_profile: Profile | str,
    cloud_profile: Profile | str,
    *,
    edge_executor: Executor,
    cloud_executor: Executor,
    size_fn: SizeFn | None = None,
    max_time: float = 1e5,
    max_events: int = 1_000_000,
    trace: bool = False,
    charge_cpu: bool = False,
) -> SimResult:
    """Run one request to the edge's `Finish` and return its timings and traffic.

    `Start()` goes to the cloud, then the edge, at t=0. Each side's jobs run on its executor
    (`wanspec.models.jobs.session_executor(model)`). Messages travel through the wire codec; a
    `size_fn(msg)` (bits) instead passes message objects as they are (toy machines in tests).
    Profiles may be given by name (see `wanspec.sim.profiles.load_profile`). `charge_cpu`: also
    charge each side's measured protocol CPU (its handlers, encoding what it sends and decoding
    what it receives) on the virtual clock, as real peers pay it (see `wanspec.sim.request`);
    the result's `protocol_cpu_s` says how much. Raises
    SimulationDeadlock if everything goes idle before Finish, SimulationTimeout past max_time
    virtual seconds or max_events events.
    """
    if not isinstance(link, Link):
        raise TypeError(f"link must be a wanspec Link, got {type(link).__name__}")
    if not max_time > 0 or not max_events > 0:
        raise ValueError("max_time and max_events must be > 0")
    for name, machine in (("edge", edge), ("cloud", cloud)):
        if not callable(getattr(machine, "handle", None)):
            raise TypeError(f"the {name} machine has no handle(event) method")
    alone = EdgeSession(edge, cloud, link, edge_executor, cloud_executor, edge_profile)
    run = simulate_many(
        [alone],
        cloud_profile,
        prefill_chunk=0,
        size_fn=size_fn,
        max_time=max_time,
        max_events=max_events,
        trace=trace,
        charge_cpu=charge_cpu,
    )
    return run.sessions[0]
