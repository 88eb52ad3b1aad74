"""Two gloo groups bootstrapping under one store name (diverged group counters): the ones that end cross-wired,
and the check that stops a rank using one; the ones whose outcome is the order of the store writes.

Why a room: gloo keys a bootstrap by group rank under the group's store name (each member writes its address
under its own group rank and reads the others'), and nothing in the keys or the addresses says which global
ranks the group was meant to hold. Two groups of one size under one name whose members' group ranks differ
write each key once, so gloo connects the writers: both bootstraps complete, and every later op on the group
runs between the wrong ranks, on their data, without an error. The simulator lets such a bootstrap complete as
gloo does (``CrossWiring.payload``: the members meet by group rank), keeps which ranks the communicator really
connects (``connect``: an op on it runs between those ranks, so one wired to a rank that never runs it waits),
and stops a rank at its first op on it with ``backends.gloo.CROSS_WIRED`` (a collective once it ran, a send or
recv at once), a check of the simulator's own: real torch raises nothing, and only the real driver's data check
(``real.data_check``) would show the defect. Where a key is written
twice, ``Rendezvous`` reports the store-key collision (``Comms`` a later group's under a name already complete);
``mark_complete_collision`` and ``LateColliders`` say when its verdict is the order of the store writes, and
``late_singleton_race`` when a one-rank group's key lands under a name another group bootstrapped under.

Measured on torch 2.15 gloo (4 processes; ranks 0, 2 and 3 make a local-synchronization group, so their group
counter runs one ahead of rank 1's; rank 0 then makes [1, 3] before [0, 2], ranks 1 to 3 [0, 2] before [1, 3]):
under name '2' rank 1 is group rank 0 of [1, 3] and rank 2 group rank 1 of [0, 2], under '3' ranks 0 and 3 the
same. Both bootstraps complete. An all_reduce of each rank's own value on its group gives 3.0 on every rank
(ranks 1 + 2 and 0 + 3), a broadcast from group rank 0 hands rank 2 rank 1's tensor and rank 3 rank 0's, and a
recv from group rank 0 on rank 2 gets rank 1's message; no rank raises (real diff seed111-case9, which only
bootstraps such groups, passed 4 runs of 4). Groups of different sizes under one name, or two writers of one
group rank, stay the store-key collision. NCCL (one unique id per name) is not measured.
"""

from __future__ import annotations

from typing import Any

from simnccl.backends.gloo import COMPLETE_COLLISION_RACE, CROSS_WIRED, SINGLETON_RACE
from simnccl.engine.sim import Sim
from simnccl.meetings import Meeting


class LateColliders:
    """A later gloo group colliding with one that already bootstrapped under its name: when every member of the
    later group comes at one moment, each writes its own address over the earlier group's key just before it
    reads its peers', so whether each reads its own group's keys is the order of the store writes, as for groups
    that bootstrap together (``COMPLETE_COLLISION_RACE``): say so on each member's stuck meeting. Measured (real
    diff seed92-case29: ranks 0 and 2 leave an all_reduce together and make [0, 2] under the name [1, 3] took,
    their counter one ahead after a local-synchronization group): passed 4 times in 8, hung 4. A member missing,
    or coming later (the first reads the earlier group's key before its peer writes), makes the hang certain and
    is not marked."""

    def __init__(self, sim: Sim) -> None:
        self._env = sim.env
        # (the earlier meeting's key, the later group's ranks) -> each member's stuck meeting and when it came
        self._late: dict[tuple[Any, ...], dict[int, tuple[Meeting, float]]] = {}

    def arrive(self, meeting: Meeting, rank: int, ranks: tuple[int, ...], stuck: Meeting) -> None:
        """``rank``, bootstrapping ``ranks``, came to ``meeting`` (the name's earlier bootstrap) and waits in
        ``stuck`` (``Comms._collision``)."""
        earlier = next(iter(meeting.arrivals.values())).payload
        if not meeting.complete or len(earlier) == 1 or set(ranks) == set(earlier):
            return  # the earlier group never bootstrapped, is one rank's (``SINGLETON_RACE``), or is this one again
        late = self._late.setdefault((meeting.key, ranks), {})
        late[rank] = (stuck, self._env.now)
        if set(late) == set(ranks) and len({at for _, at in late.values()}) == 1:
            for each, _at in late.values():
                each.problem = f"{each.problem}; {COMPLETE_COLLISION_RACE}"


def late_singleton_race(meeting: Meeting, rank: int, ranks: tuple[int, ...], name: str, now: float) -> str | None:
    """The race of ``rank`` writing its one-rank group's (``ranks``) key at ``now`` under ``name``, whose
    bootstrap ``meeting`` another group's members all came to, or None.

    In the simulated timing each of them read its peers' keys before this write, but real ranks leave
    init_process_group apart (gloo's init does not hold them), so whether each read first is the order of the
    writes. Seen (real diff seed132-case33: rank 0 wrote [0]'s key 0.2 s after ranks 1 and 2 came to bootstrap
    [1, 2] under '2'): rank 1 hung in that bootstrap, which the simulator had complete. An earlier one-rank group,
    or the writer's own group again, read nothing: no race."""
    if not meeting.complete or not meeting.arrivals:
        return None
    first = next(iter(meeting.arrivals.values()))
    if len(first.payload) == 1 or first.payload == ranks:
        return None
    assert meeting.completed_at is not None
    bootstrappers, theirs = list(meeting.arrivals), list(first.payload)
    when = (
        f"while ranks {bootstrappers} were bootstrapping ranks {theirs} under it"
        if now < meeting.completed_at
        else f"{now - meeting.completed_at:g} s after ranks {bootstrappers} bootstrapped ranks {theirs} under it"
    )
    return (
        f"store key collision under group name {name!r}: rank {rank} wrote its one-rank group's key under that "
        f"name {when}; {SINGLETON_RACE}"
    )


def mark_complete_collision(meeting: Meeting) -> None:
    """A gloo store-key collision where every colliding group has all its members under the name: the real
    verdict is the order of the store writes (``COMPLETE_COLLISION_RACE``), so say so. The run still hangs
    here; a member still missing, as after a skipped new_group, makes the hang certain and is not marked."""
    problem = meeting.problem
    if problem is None or not problem.startswith("store key collision") or COMPLETE_COLLISION_RACE in problem:
        return
    groups = {arrival.payload for arrival in meeting.arrivals.values()}
    if len(groups) > 1 and all({r for r, a in meeting.arrivals.items() if a.payload == g} == set(g) for g in groups):
        meeting.problem = f"{problem}; {COMPLETE_COLLISION_RACE}"


class CrossWiring:
    """Which gloo bootstrap meetings two groups joined by group rank, and the communicators they made."""

    def __init__(self, members: dict[int, tuple[int, ...]], sim: Sim) -> None:
        self._members = members  # the communicator registry's: comm id -> its ranks
        self._env = sim.env
        self._record = sim.trace.record
        # id(meeting) -> rank -> the ranks of the group it bootstraps, for a meeting another group joined
        self._groups: dict[int, dict[int, tuple[int, ...]]] = {}
        # comm id -> (its ranks in group-rank order, the groups that met there): read on every op of a group
        self.wires: dict[int, tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]] = {}

    def payload(self, meeting: Meeting, rank: int, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """What ``rank``, bootstrapping ``ranks`` on gloo, arrives at ``meeting`` (incomplete, no problem, an
        earlier arrival there) with: ``ranks``, unless another group is there whose size it shares and whose
        members left its group rank's key unwritten, where it meets them by group rank (the meeting's first
        payload, so ``Rendezvous`` sees no disagreement). Where its group rank's key was already written by
        another group's member, the meeting gets the store-key collision, named as ``Rendezvous`` names one."""
        first = next(iter(meeting.arrivals.values()))
        groups = self._groups.get(id(meeting))
        if groups is None and (first.payload is ranks or first.payload == ranks):
            return ranks  # the same group, the common case: nothing to ask
        index = ranks.index(rank)
        for other, arrival in meeting.arrivals.items():
            theirs = groups.get(other, arrival.payload) if groups is not None else arrival.payload
            if len(theirs) != len(ranks):
                return ranks  # another size: ``Rendezvous._disagreement``'s collision
            if theirs.index(other) == index:  # two groups' writers of one key
                if first.payload is ranks or first.payload == ranks:
                    # ``Rendezvous`` compares an arrival with the first only, and would see no disagreement
                    meeting.problem = (
                        f"store key collision under group name {meeting.group!r}: rank {other} bootstraps ranks "
                        f"{list(theirs)}, rank {rank} bootstraps ranks {list(ranks)}, both as group rank {index}"
                    )
                return ranks  # else ``Rendezvous._disagreement``'s collision, with the first arrival
        if first.payload is ranks or first.payload == ranks:
            return ranks
        self._groups.setdefault(id(meeting), {})[rank] = ranks
        # the meeting waits for its key's writers: this rank in place of the first group's rank at its group rank
        meeting.expected = (*meeting.expected[:index], rank, *meeting.expected[index + 1 :])
        return first.payload

    def joined(self, meeting: Meeting) -> bool:
        """Whether another group joined this bootstrap meeting by group rank (``payload``)."""
        return id(meeting) in self._groups

    def connect(self, meeting: Meeting, rank: int, name: str, comm_id: int) -> None:
        """A joined meeting's communicator, on one member once it is ready: its members are the ranks that met,
        in group-rank order, not the member's group; an op on it is the check's (``failure``)."""
        groups = self._groups[id(meeting)]
        own = [groups.get(r, arrival.payload) for r, arrival in meeting.arrivals.items()]
        ranks = meeting.expected  # in group-rank order, each the writer of its key (``payload``)
        self._members[comm_id] = ranks
        self.wires[comm_id] = (ranks, tuple(dict.fromkeys(own)))
        self._record(self._env.now, rank, "cross-wired", name, ranks)

    def failure(self, comm_id: Any, name: str, group: tuple[int, ...], op_name: str) -> tuple[str, list[int]] | None:
        """The check's text for an op on communicator ``comm_id`` of group ``group`` named ``name``, and the ranks
        outside the group that the communicator connects (what a real rank's data shows: ``real.data_check``), or
        None where that communicator connects its own group."""
        found = self.wires.get(comm_id)
        if found is None:
            return None
        wire, groups = found
        other = next((g for g in groups if g != group), group)
        text = CROSS_WIRED.format(name=name, group=list(group), other=list(other), wire=list(wire), op=op_name)
        return text, sorted(set(wire) - set(group))
