"""The rank loop: one simpy process per rank runs its Program op by op, through the dispatch table, until the
end, an error, or a fault; how a rank ends is recorded here.

Why a room: this is where a newcomer starts. Each op type has one handler in one room (the table is built in
``core.Engine``); ``Collective`` and ``PointToPoint`` ops go to ``Collectives``. The fast paths are two calls
here — a run of outsider calls taken in place, a block of world-wide group creation taken by a cohort — and
are invisible to every handler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import simpy

from simnccl.c10d import Group, ProcessContext, TorchError
from simnccl.engine.config import SimConfig, WorkloadFailure
from simnccl.engine.injection import Injection
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.sockets import GlooSockets
from simnccl.engine.state import (
    DEFAULT_GROUP_MISSING,
    GROUP_NOT_REGISTERED,
    UNREGISTERED_GROUP,
    AsyncError,
    Crash,
    PeerLost,
    ProcessAbort,
    RankRuntime,
    Waiting,
)
from simnccl.env_knobs import torchrun_env
from simnccl.flight_recorder import FlightRecorder, buffer_size
from simnccl.memory import SimulatedOOM
from simnccl.ops import ON_A_GROUP, Collective, NewGroup, Program
from simnccl.policy import History
from simnccl.release import Impl
from simnccl.watchdog import TimeoutAction

if TYPE_CHECKING:
    from simnccl.engine.fast import FastPaths

Handler = Callable[[RankRuntime, Any], Waiting | None]


def oom_error(rt: RankRuntime, err: SimulatedOOM) -> TorchError:
    """The error torch 2.15 raises for an out-of-memory: ``torch.OutOfMemoryError`` for a tensor's allocation, but
    NCCL's failed calloc (a communicator's init or first collective) is an NCCL error, typed by the backend that
    owns the communicator. Why it matters: startup code that catches one type and not the other behaves
    differently in production, so the simulator must not name a type torch never raises there.

    * legacy ``ProcessGroupNCCL``: ``C10D_NCCL_CHECK`` throws ``DistBackendError``
      (torch/include/torch/csrc/distributed/c10d/NCCLUtils.hpp:76-85);
    * nccl2 and nccl-lazy (``c10d::nccl2::ProcessGroupNCCL``): ``NCCL_CHECK`` and ``NCCLBootstrap::createNcclComm``
      throw ``NCCLException``, a plain ``std::exception`` (torch/include/torch/csrc/distributed/c10d/nccl2/
      ProcessGroupNCCL.hpp:79, 95-99), which torch's binding turns into ``RuntimeError``
      (torch/include/torch/csrc/Exceptions.h:113).
    """
    if err.comm_group is None:
        return TorchError("torch.OutOfMemoryError", str(err))
    name = err.comm_group.split("/p2p-")[0]  # a legacy p2p pair is named "<group>/p2p-<lo>-<hi>"
    impls = [c.impl for g in reversed(rt.groups) if g.name == name for c in g.comms.values() if c.impl.is_nccl]
    assert impls, f"no NCCL communicator of group {name!r} on rank {rt.rank} ran out of memory"
    type_name = "torch.distributed.DistBackendError" if impls[0] is Impl.LEGACY else "RuntimeError"
    return TorchError(type_name, str(err))


def make_ranks(config: SimConfig, programs: Sequence[Program]) -> list[RankRuntime]:
    """Every rank's process state: its program, environment (as its launcher sets it), node and recorder.

    Every rank starts with one empty group-creation history, shared until a rank records into it (copy-on-write:
    ``engine/fast/histories.py``); the flight recorder's size is read once (no launcher variable sets it). Why:
    a 131,072-rank world makes this state 131,072 times, and a history and a reading each were half of it."""
    cluster = config.cluster
    world_size = cluster.world_size
    if len(programs) != world_size:
        raise ValueError(f"{len(programs)} programs for a world of {world_size} ranks")
    torchrun = config.launcher == "torchrun"
    capacity = buffer_size(config.env)
    history = History()
    ranks = []
    shape = {"world_size": world_size, "local_world_size": world_size // cluster.nodes, "nodes": cluster.nodes}
    for rank, (node, local) in enumerate(cluster.placements()):
        if torchrun:
            env = torchrun_env(rank=rank, local_rank=local, node=node, env=config.env, **shape)
        else:
            env = dict(config.env)
        ctx = ProcessContext(
            rank=rank,
            world_size=world_size,
            local_rank=local,
            device_count=cluster.device_count,
            env=env,
        )
        ranks.append(
            RankRuntime(
                rank=rank,
                program=programs[rank],
                ctx=ctx,
                node=node,
                history=history,
                history_shared=True,
                fr=FlightRecorder(rank, capacity=capacity),
            )
        )
    return ranks


def _on_destroyed_group(rt: RankRuntime) -> bool:
    """Whether the rank's current op is a collective or send/recv on the handle of a group it destroyed."""
    ops = rt.program.ops
    op = ops[rt.pc] if rt.pc < len(ops) else None
    if not isinstance(op, ON_A_GROUP):
        return False
    target = rt.handles.get(op.group)
    return isinstance(target, Group) and target.destroyed


class RankLoop:
    def __init__(
        self,
        sim: Sim,
        dispatch: Mapping[type, Handler],
        collective: Handler,
        p2p: Handler,
        fast: FastPaths,
        injection: Injection,
        rendezvous: Rendezvous,
        sockets: GlooSockets,
    ) -> None:
        self.sim = sim
        self.env = sim.env
        self.guard = sim.guard
        self.record = sim.trace.record
        self.dispatch = dict(dispatch)
        self.collective = collective
        self.p2p = p2p
        self.fast = fast
        self.injection = injection
        self.rendezvous = rendezvous
        self.sockets = sockets

    def start(self) -> None:
        for rt in self.sim.ranks:
            self.sim.procs[rt.rank] = self.env.process(self._process(rt))

    def _process(self, rt: RankRuntime) -> Waiting:
        ops = rt.program.ops
        dispatch = self.dispatch
        take_outsider_calls = self.fast.take_outsider_calls
        block_starts = self.fast.block_starts(rt.program)
        op_faults = self.injection.op_faults
        program_faults = self.injection.program_faults
        tick = self.guard.tick
        try:
            while rt.pc < len(ops):
                if take_outsider_calls is not None and type(ops[rt.pc]) is NewGroup and take_outsider_calls(rt):
                    continue
                tick()
                op = ops[rt.pc]
                if op_faults:
                    fault = op_faults.get((rt.rank, rt.pc))
                    if fault is not None:
                        yield from self.injection.inject(rt, fault)
                if program_faults:
                    rewritten = program_faults.get((rt.rank, rt.pc))
                    if rewritten is not None:
                        self.injection.program_fault(rt, *rewritten)
                if block_starts is not None and block_starts[rt.pc]:
                    yield from self.fast.run_cohort(rt)
                    continue
                handler = dispatch.get(type(op))
                if handler is None:
                    handler = self.collective if isinstance(op, Collective) else self.p2p
                work = handler(rt, op)
                if work is not None:
                    yield from work
                rt.pc += 1
            yield from self.rendezvous.settle(rt)
            rt.status = "done"
            self.sim.ended += 1
            rt.finished_at = self.env.now
            self.record(self.env.now, rt.rank, "done")
        except simpy.Interrupt as interrupt:
            cause = interrupt.cause
            while True:  # a later crash or heartbeat-monitor kill may cut a stall or a dump wait short
                try:
                    if isinstance(cause, Crash) and cause.stall:
                        yield from self.injection.stall(rt, cause.fault)
                    elif not isinstance(cause, Crash):
                        rt.status = "blocked"
                        if cause.wait_s > 0:
                            yield self.env.timeout(cause.wait_s)
                    break
                except simpy.Interrupt as again:
                    cause = again.cause
            if isinstance(cause, Crash):
                self._fail(rt, "crash", cause, abort=True)
                return
            action: TimeoutAction = cause
            self._fail(rt, action.kind, TorchError(action.error_type, action.message), abort=action.outcome == "abort")
        except Crash as err:
            self._fail(rt, "crash", err, abort=True)
        except AsyncError as err:
            self._fail(rt, err.action.kind, err, abort=err.action.outcome == "abort")
        except ProcessAbort as err:
            self._fail(rt, "abort", err)
        except PeerLost as err:
            self._fail(rt, "peer-lost", err)
        except TorchError as err:
            self._fail(rt, "error", err)
        except SimulatedOOM as err:
            self._fail(rt, "oom", oom_error(rt, err))
        except WorkloadFailure as err:
            self._fail(rt, "check", TorchError(err.type_name, str(err), err.facts))
        except GeneratorExit:  # the process closed (the environment dropped): nothing to report
            raise
        except BaseException as err:
            # Not something a rank does (a defect, a user policy's error, a timeout or Ctrl-C): the run ends
            # here, not when simpy's turn for this process's event comes (``Sim.halt``).
            self.sim.halt(err)
            raise

    def _fail(self, rt: RankRuntime, kind: str, err: TorchError, *, abort: bool = False) -> None:
        destroyed = not abort and kind in ("timeout", "peer-lost", "error") and _on_destroyed_group(rt)
        # not where torch's lookup of the group raised, with the default group gone, before any logger ran
        if destroyed and err.message not in (DEFAULT_GROUP_MISSING, GROUP_NOT_REGISTERED):
            # torch 2.15's @_exception_logger builds its log record with get_backend(kwargs["group"]), which
            # raises this for a destroyed (unregistered) group in place of the op's own error (measured: a gloo
            # all_reduce, all_gather_into_tensor, reduce_scatter_tensor or all_to_all_single on a destroyed 2 s
            # group's handle, its peer absent, raises it after 2 s; with the group passed by position the logger
            # asks the default group, and gloo's timeout RuntimeError comes through: ops here are called with
            # group=, as the real driver calls them). So a timeout here is no hang but an error the program can
            # catch: the hang entry moves under the error (``replaced_timeout``), as what the rank waited for,
            # for whom and why, which torch's text (a group object) does not say.
            err = TorchError("ValueError", UNREGISTERED_GROUP)
            if kind == "timeout":
                rt.replaced_timeout, rt.timeout_hang = rt.timeout_hang, None
            kind = "error"
        rt.status = "aborted" if kind == "abort" or abort else "error"
        self.sim.ended += 1
        rt.error = err
        rt.error_kind = kind
        rt.error_op = rt.program.ops[rt.pc].describe() if rt.pc < len(rt.program.ops) else "<end>"
        rt.block = None
        now = self.sim.now()
        rt.finished_at = now
        self.record(now, rt.rank, "error", kind, err.type_name, err.message)
        if rt.status == "aborted" and self.sockets.used:
            # A dead process's sockets close: gloo peers waiting on it fail (a Python error keeps them open).
            self.sockets.close(rt, [c for g in rt.groups for c in g.comms.values()])
