"""Recovery orchestration, torchft-style and simulated: exclude a crashed or slow GPU, bring in a spare, go on.

Why this module: the rewritten backend exists for the "one bad GPU" problem, so a team must be able to rehearse
the whole loop on a laptop — a worker dies or drags, something notices, a quorum decides who trains next, the
process groups are re-created (through the active policy, so their memory cost is the one the team will pay),
and training resumes from the last committed step. Everything below is deterministic: no wall clock, no
unordered iteration, a bounded number of recoveries.

Shape (the engine stays the only simpy user, DESIGN rule 3):

* A scenario with a ``[recovery]`` table runs a data-parallel training loop. The cluster's ``ranks_per_node``
  workers per node run the job (rank ``r`` starts on GPU ``r % ranks_per_node`` of its node); the node's other
  GPUs are spares. ``replicas`` splits the ranks into replica groups (handle ``replica``) and, across replicas,
  data-parallel groups of the same position (handle ``dp``); the default group is ``world``.
* ``[workload] steps`` is the body of ONE training step on every rank (e.g. compute, then all_reduce on
  ``replica`` and on ``dp``). The orchestrator generates each rank's program: ``set_device`` on its GPU, a fresh
  ``init_process_group`` and the ``new_group`` calls (the variant's policy decides how they are made), then the
  steps from the first uncommitted one, a commit (a ``world`` barrier, i.e. every member agrees the step
  succeeded, as torchft's ``should_commit``) every ``commit_every`` steps and after the last.
* A *segment* is one engine run with one membership. The orchestrator reads its outcome — which commits every
  member passed, each rank's local (pre-collective) time per step, crashed processes, watchdog timeouts — and
  takes decisions in time order: a quorum at every commit, and one when a failure is detected. The first
  decision that changes the membership ends the segment at that time: what the engine simulated after it never
  happened for the orchestrator (causality: nothing later changes anything earlier in a deterministic run).
* ``quorum(time_s, state)`` is a pure function returning the decision *and* its explanation (torchft's
  ``quorum_compute`` style): failed ranks and stragglers out, a spare on the same node in, or a clear refusal.
* The next segment starts from the last committed step, so no committed step is ever lost; steps finished
  after that commit are re-done and reported as lost.

Faults come from ``[faults]`` and apply to the first segment only (ranks are first-segment ranks; ``at_op``
counts ops of that rank's generated program — the scenario parser also bounds it by the ``[workload]`` length,
so files normally use ``at_s``). Detection: a crashed process is seen by the launcher at its next poll
(``monitor_interval_s``, torchrun's ``--monitor-interval`` default 0.1 s); a live but stuck rank (a stall) only
through the watchdog of the ranks waiting for it (the group timeout plus the flight-recorder dump wait).

Simplified on purpose: a replacement comes from the failed GPU's own node (the launcher model keeps
``ranks_per_node`` equal on every node); every process restarts at a recovery (torchft restarts only the
failed replica and heals it from a peer); a step's local time is what a straggler slows; a rank's own error
(OOM, a torch error, an abort) is not routed around, since the same programs would fail again.

The package's rooms: ``config`` (the ``[recovery]`` table), ``programs`` (each segment's generated programs and the
up-front check), ``quorum`` (the pure decision), ``observe`` (reading a segment's outcome) and ``orchestrate``
(segments in time order, the report, the runner's entry point).
"""

from simnccl.recovery.config import DP, MARKER_LABEL, REPLICA, START, RecoveryConfig, parse_recovery
from simnccl.recovery.observe import SegmentView, observe
from simnccl.recovery.orchestrate import RecoveryOutcome, RecoveryReport, SegmentRecord, orchestrate, run_recovery
from simnccl.recovery.programs import check_recovery, initial_devices, replica_groups, segment_programs
from simnccl.recovery.quorum import (
    Decision,
    Exclusion,
    Observation,
    QuorumState,
    Replacement,
    StepSample,
    quorum,
)

__all__ = [
    "DP",
    "MARKER_LABEL",
    "REPLICA",
    "START",
    "Decision",
    "Exclusion",
    "Observation",
    "QuorumState",
    "RecoveryConfig",
    "RecoveryOutcome",
    "RecoveryReport",
    "Replacement",
    "SegmentRecord",
    "SegmentView",
    "StepSample",
    "check_recovery",
    "initial_devices",
    "observe",
    "orchestrate",
    "parse_recovery",
    "quorum",
    "replica_groups",
    "run_recovery",
    "segment_programs",
]
