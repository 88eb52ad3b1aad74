"""The simpy engine (DESIGN rule 3: the only simpy user): one process per rank runs its Program; meetings match
ranks; a verdict always comes. It is cut into rooms, each one concept owning its state; ``core.Engine`` wires
them and runs them. A map, in the order a run passes through them:

``core``         Engine: builds and wires the rooms; the op -> handler dispatch table
``ranks``        the rank loop: a simpy process per rank, op by op; how a rank ends
``rendezvous``   meetings: arrivals, their agreement, completion, waiting, run-ahead settling
``groups``       init_process_group / new_group / split_group / destroy_process_group on a rank
``policy_gate``  applying the policy to each group call; the members-agree check
``planning``     torch's plan for a new_group on one rank (validated members, cached)
``comms``        communicator lifecycle: create, bootstrap, split, ids, destroy
``collectives``  all_reduce & co, send/recv, gloo broadcast trees, p2p pair communicators
``memory``       device ledgers, CUDA contexts, charging, group records; set_device/checks/checkpoints
``caching_allocator`` torch's alloc/free: cached blocks torch reuses and NCCL cannot
``nvls``         NVLS multicast slots per node: bound at communicator init, freed at destroy
``timing``       how long each meeting and compute takes; straggler ranks and links
``sockets``      gloo's closed sockets and the peers they fail
``injection``    fault injection: arming the schedule on the rooms, crashes, stalls, async errors
``watchdogs``    the run in simulated time: timeouts, flight-recorder dumps, heartbeat monitors
``outcome``      the verdict and the hang report
``fast/``        the fast paths (outsiders, cohorts, rank classes, shared histories): same outcome, less work
``sim``          what every room shares: clock, ranks, processes, trace, guard
``state``        the shared nouns: a rank's runtime state, the outcome, how a rank stops
``config``       SimConfig, Limits, and the errors a caller may see
"""

from __future__ import annotations

from simnccl.engine.config import EngineGuardError, Limits, SimConfig, WorkloadFailure
from simnccl.engine.core import Engine
from simnccl.engine.fast.cohorts import Cohort
from simnccl.engine.policy_gate import unchanged_decision
from simnccl.engine.state import Block, GroupRecord, RankRuntime, RunOutcome, Snapshot, Waiting

__all__ = [
    "Block",
    "Cohort",
    "Engine",
    "EngineGuardError",
    "GroupRecord",
    "Limits",
    "RankRuntime",
    "RunOutcome",
    "SimConfig",
    "Snapshot",
    "Waiting",
    "WorkloadFailure",
    "unchanged_decision",
]
