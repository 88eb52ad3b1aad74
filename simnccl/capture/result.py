"""What a capture produced (``CapturedRun``: Programs, per-rank calls, notes) and the branch settings it ran under.

Why its own module: everything here is plain data about a finished capture — written to TOML/JSON, simulated,
checked for replay — and none of it needs the torch machinery that produced it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simnccl.c10d import _binds_device
from simnccl.ops import (
    NO_OPTIONS,
    OPTION_FIELDS,
    InitProcessGroup,
    Op,
    Program,
)
from simnccl.policy.as_captured import SPEC_PREFIX as AS_CAPTURED
from simnccl.policy.as_captured import AsCaptured, captured_policy
from simnccl.release import DeviceBackend, ReleaseError, get_release


class CaptureError(RuntimeError):
    """The capture could not produce Programs: bad arguments, or the code failed or hung on a rank."""


NO_POLICY = "torch-default"  # the scenario files' name for "no policy"


def _plain_policy(policy: str | None) -> str | None:
    return None if policy in (None, "", NO_POLICY) else policy


def as_captured_spec(policy: Any) -> Any:
    """The policy replaying a capture made under ``policy`` as it decided (``simnccl.policy.as_captured``): a spec
    for a spec, an ``AsCaptured`` for a policy object (``capture(..., policy=obj)``)."""
    if isinstance(policy, str):
        return policy if captured_policy(policy) is not None else f"{AS_CAPTURED}{policy})"
    from simnccl.policy import PolicyError, get_policy

    if isinstance(policy, AsCaptured):
        return policy
    try:
        return AsCaptured(get_policy(policy))
    except PolicyError as err:
        raise CaptureError(f"policy: {err}") from None


def _spec_of(description: Any) -> str | None:
    """The spec a policy description (``describe_policy``) stands for, or None: a class by its import spec where
    it has no fields of its own to keep, compositions and as-captured replays of such parts."""
    if isinstance(description, str):
        return description
    if not isinstance(description, Mapping):
        return None
    if "as_captured" in description:
        inner = _spec_of(description["as_captured"])
        return None if inner is None else f"{AS_CAPTURED}{inner})"
    if "compose" in description:
        parts = [_spec_of(part) for part in description["compose"]]
        return None if any(part is None for part in parts) else "+".join(parts)  # type: ignore[arg-type]
    spec = description.get("import")
    return spec if isinstance(spec, str) and not description.get("fields") else None


def _described(policy: Any) -> Any:
    """A policy object as JSON data (``describe_policy``), or its repr where nothing can rebuild it."""
    from simnccl.policy import PolicyError
    from simnccl.policy.specs import describe_policy

    try:
        return describe_policy(policy)
    except PolicyError:
        return repr(policy)


def _policy_spec(policy: Any) -> str:
    """``policy`` (a spec, or an object) as a scenario file names it; CaptureError where no spec names it."""
    from simnccl.policy import PolicyError
    from simnccl.policy.specs import describe_policy

    try:
        described = _spec_of(describe_policy(policy))
    except PolicyError as err:
        raise CaptureError(f"policy: {err}") from None
    if described is None:
        raise CaptureError(
            f"policy {getattr(policy, 'name', policy)!r}: a scenario file names a policy by its spec, and this one has "
            "none (an object with fields of its own); capture under its spec ('package.module:Name') to write one"
        )
    return described


class BranchMismatch(CaptureError, ValueError):
    """A replay under a release/env/policy that would have changed what the captured code saw (and did)."""


@dataclass(frozen=True, slots=True)
class BranchSettings:
    """What captured code can branch on, decided by release, env and policy before any group exists.

    Why these: DeviceMesh takes ``split_group`` when the default group has a ``bound_device_id`` (2.15's nccl2
    binds one even without ``device_id``; legacy and 2.14 don't) and loops ``new_group`` otherwise; it compares
    ``getBackendName()`` (``nccl2`` vs ``nccl``); and a ``lazy_init`` default group is no split source. The
    simulator's own rules (``simnccl.c10d``, ``simnccl.release``) answer each, so capture and replay agree.
    """

    default_backend: str  # the implementation the default group's accelerator leg reports
    default_bound: bool  # the default group has a bound_device_id
    default_lazy: bool  # the default group is lazy_init (and the release has the option)
    nccl_names: tuple[tuple[str, str, bool], ...]  # (name, implementation, binds) for every NCCL-family name

    def __str__(self) -> str:
        bound = "bound (DeviceMesh: split_group)" if self.default_bound else "unbound (DeviceMesh: new_group loop)"
        lazy = ", lazy_init" if self.default_lazy else ""
        return f"default group {self.default_backend}, {bound}{lazy}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "default_backend": self.default_backend,
            "default_bound": self.default_bound,
            "default_lazy": self.default_lazy,
            "nccl_names": {name: {"impl": impl, "binds": binds} for name, impl, binds in self.nccl_names},
        }

    def differences(self, other: BranchSettings) -> list[str]:
        """What ``other`` changes, in words (for the refusal)."""
        out = []
        if self.default_bound != other.default_bound:
            out.append(
                f"the default group would be {'bound' if other.default_bound else 'unbound'} instead of "
                f"{'bound' if self.default_bound else 'unbound'} (DeviceMesh takes "
                f"{'split_group' if other.default_bound else 'the new_group loop'} there)"
            )
        if self.default_backend != other.default_backend:
            new, old = other.default_backend, self.default_backend
            out.append(f"the default group would report backend {new!r}, not {old!r}")
        if self.default_lazy != other.default_lazy:
            out.append(f"the default group would {'' if other.default_lazy else 'not '}be lazy_init")
        if not out:
            changed = [a[0] for a, b in zip(self.nccl_names, other.nccl_names, strict=True) if a != b]
            out.append(f"backend {', '.join(changed)} would resolve or bind differently")
        return out


def branch_settings(
    release: str, env: Mapping[str, str], policy: str | None, init: InitProcessGroup | None
) -> BranchSettings:
    """The ``BranchSettings`` of ``init`` (the first recorded ``init_process_group``) under these settings.

    The policy's ``on_init`` is applied to the recorded call (its env knobs, backend, device_id, lazy_init),
    as ``simnccl.torch_apply`` would before torch runs it.
    """
    from simnccl.policy import InitRequest, PolicyError, get_policy
    from simnccl.release import NCCL_FAMILY_NAMES, resolve_backend

    try:
        rel = get_release(release)
    except ReleaseError as err:
        raise CaptureError(f"release: {err}") from None
    env_ = dict(env)
    backend = init.backend if init is not None else None
    device_id = init.device_id if init is not None else None
    options = init.pg_options if init is not None else NO_OPTIONS
    if policy is not None and init is not None:
        try:
            chosen = get_policy(policy)
        except PolicyError as err:
            raise CaptureError(f"policy: {err}") from None
        plan = chosen.on_init(InitRequest(0, 1, release, env_, backend, device_id, options))
        env_.update(plan.env)
        backend, device_id, options = plan.backend, plan.device_id, plan.pg_options
    names = []
    for name in NCCL_FAMILY_NAMES:
        try:
            impl = rel.impl_for_name(name, env_)
        except (KeyError, ValueError, ReleaseError):
            names.append((name, "unknown", False))
            continue
        names.append((name, str(impl.cpp_name), _binds_device(rel, DeviceBackend("cuda", name, impl))))
    try:
        leg = resolve_backend(rel, backend, env_).for_device("cuda")
    except Exception:  # a backend this release rejects: the replay reports torch's error itself
        leg = None
    reported = "none" if leg is None else str(leg.impl.cpp_name)
    bound = (device_id is not None and not str(device_id).startswith("cpu")) or _binds_device(rel, leg)
    lazy = bool(options.lazy_init) and rel.lazy_init_option
    return BranchSettings(reported, bool(bound), lazy, tuple(names))


def _first_init(programs: Sequence[Program]) -> InitProcessGroup | None:
    for program in programs[:1]:
        for op in program.ops:
            if isinstance(op, InitProcessGroup):
                return op
    return None


def _settings_text(release: str, env: Mapping[str, str], policy: str | None) -> str:
    parts = [f"torch {release}", *(f"{k}={v}" for k, v in sorted(env.items()))]
    parts.append(f"policy {policy}" if policy else "no policy")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded torch call on one rank: its name, its arguments as plain values, and its group handle."""

    name: str
    args: Mapping[str, Any]
    handle: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.name, "args": dict(self.args), "handle": self.handle}


@dataclass(frozen=True, slots=True)
class RankCapture:
    """What one simulated rank called."""

    rank: int
    ops: tuple[Op, ...]
    calls: tuple[Call, ...]
    notes: tuple[str, ...] = ()
    # NCCL knobs the code itself set (or removed: None) in os.environ, not its policy, and whether their value held
    # from its first init_process_group to its first collective (``ranks.knobs_set_by_code``)
    env_set: tuple[tuple[str, str | None, bool], ...] = ()


@dataclass(frozen=True)
class CapturedRun:
    """Every rank's Program (identical ones shared), the calls behind them, and how they were captured."""

    world_size: int
    gpus_per_node: int
    release: str
    env: Mapping[str, str]
    programs: tuple[Program, ...]
    calls: tuple[tuple[Call, ...], ...]
    notes: tuple[str, ...] = ()
    mode: str = "fork"
    wall_s: float = 0.0
    policy: str | None = None  # the policy the ranks ran under (simnccl.torch_apply.apply), None: plain torch
    gpu: str = "h100-80gb"  # the GPU kind the code was told it runs on (device properties, free memory)

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    def simulate(
        self,
        *,
        gpu: str | None = None,
        release: str | None = None,
        env: Mapping[str, str] | None = None,
        policy: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Replay the Programs in the simulator on ``nodes x gpus_per_node`` GPUs of kind ``gpu`` (default: the
        kind the code was captured on).

        Refused (``BranchMismatch``) when ``release``/``env``/``policy`` would have changed what the captured code
        saw (``check_replay``): the Programs are one branch of the code, not the code.
        """
        from simnccl.testing import simulate

        self.check_replay(release=release, env=env, policy=policy)
        policy = self.replay_policy(policy)
        if self.world_size % self.gpus_per_node:
            raise CaptureError(
                f"cannot replay a world of {self.world_size} on nodes of {self.gpus_per_node} GPUs: "
                "capture with a gpus_per_node that divides the world size"
            )
        return simulate(
            [p.ops for p in self.programs],  # the same tuple for ranks sharing a Program: shared in the engine
            gpu=gpu or self.gpu,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            release=release or self.release,
            env=dict(self.env if env is None else env),
            policy=policy,
            **kwargs,
        )

    def captured_under(self) -> BranchSettings:
        """What the captured code could branch on, under the settings it was captured with."""
        return branch_settings(self.release, self.env, self.replay_policy(None), _first_init(self.programs))

    def replay_policy(self, policy: Any) -> Any:
        """The policy a replay runs under: ``policy`` for a capture made without one (its Programs are the code's
        own calls); for one made under a policy, ``as-captured(...)`` of it (an ``AsCaptured`` of a policy
        object): its Programs are that policy's decisions, and asking it again about its own output would
        re-decide them (``check_replay`` refuses any other policy)."""
        if self.policy is None:
            return _plain_policy(policy)
        return as_captured_spec(self.policy)

    def check_replay(
        self, *, release: str | None = None, env: Mapping[str, str] | None = None, policy: str | None = None
    ) -> None:
        """Raise ``BranchMismatch`` when replaying under these settings would not be what real torch runs.

        ``None`` keeps the capture's own release/env; a capture made under a policy replays as it decided
        (``replay_policy``) with ``policy`` None, that policy or ``as-captured(...)`` of it, and refuses another:
        its Programs are that policy's decisions, not the code's requests another policy could decide.
        """
        rel = release or self.release
        env_ = dict(self.env if env is None else env)
        policy = _plain_policy(policy)
        if self.policy is not None and policy not in (None, self.policy, as_captured_spec(self.policy)):
            raise BranchMismatch(
                f"refusing to simulate a capture made under policy {self.policy!r} as policy {policy!r}: its "
                f"Programs hold the calls {self.policy!r} decided, not the ones the code asked for, so another "
                f"policy would be asked about {self.policy!r}'s output; re-capture under {policy!r} for an honest "
                f"answer: capture(..., policy={policy!r}) or simnccl capture --policy {policy}"
            )
        policy = self.replay_policy(policy)
        wanted = branch_settings(rel, env_, policy, _first_init(self.programs))
        have = self.captured_under()
        if wanted == have:
            return
        why = "; ".join(have.differences(wanted))
        asked = _settings_text(rel, env_, policy)
        cli = " ".join([f"--release {rel}", *(f"--env {k}={v}" for k, v in sorted(env_.items()))])
        cli += f" --policy {policy}" if policy else ""
        raise BranchMismatch(
            f"refusing to simulate a capture made under {_settings_text(self.release, self.env, self.policy)} "
            f"as {asked}: {why}, so real torch would run other calls than the captured ones; re-capture under "
            f"those settings for an honest answer: capture(..., release={rel!r}, env={dict(sorted(env_.items()))!r}"
            f"{f', policy={policy!r}' if policy else ''}) or simnccl capture {cli}"
        )

    def summary(self) -> str:
        """Per distinct program: the ranks running it and what they call."""
        lines = [
            f"captured {self.world_size} ranks ({self.nodes} node(s) x {self.gpus_per_node} GPUs), "
            f"emulating torch {self.release}, {self.mode} mode, {self.wall_s:.2f} s",
            f"  captured under {_settings_text(self.release, self.env, self.policy)}: {self.captured_under()}",
        ]
        for program, ranks in _program_ranks(self.programs):
            counts: dict[str, int] = {}
            for op in program.ops:
                counts[op.name] = counts.get(op.name, 0) + 1
            shown = ", ".join(f"{n} {k}" for k, n in counts.items())
            lines.append(f"  ranks {_ranks_text(ranks)}: {len(program.ops)} ops ({shown})")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """Programs and calls as plain data: one entry per distinct program, and per distinct list of calls, each
        with the ranks that share it (a 512-rank Megatron startup is one program and eight lists of calls, which
        differ in ``set_device``'s index, not 512 of each)."""
        return {
            "world_size": self.world_size,
            "gpus_per_node": self.gpus_per_node,
            "release": self.release,
            "env": dict(self.env),
            "policy": self.policy if self.policy is None or isinstance(self.policy, str) else _described(self.policy),
            "captured_under": self.captured_under().to_dict(),
            "programs": [
                {"ranks": ranks, "ops": program.to_list()} for program, ranks in _program_ranks(self.programs)
            ],
            "calls": [
                {"ranks": ranks, "calls": [c.to_dict() for c in calls]} for calls, ranks in _call_ranks(self.calls)
            ],
            "notes": list(self.notes),
        }

    def to_scenario_toml(self, name: str = "captured", *, gpu: str = "h100-80gb", description: str = "") -> str:
        """A scenario file (``simnccl run`` reads it) whose explicit steps expand to exactly these Programs.

        Ops every program starts with are written once; each distinct program's remaining ops follow with
        ``on_ranks`` (steps append to each rank's list in file order, so this is exact).
        """
        groups = _program_ranks(self.programs)
        prefix = _common_prefix([p.ops for p, _ in groups])
        lines = [
            "# Captured by simnccl.capture: every rank's torch.distributed calls as explicit steps.",
            f"# Captured under {_settings_text(self.release, self.env, self.policy)}: {self.captured_under()}.",
            "# Another release, TORCH_DIST_USE_NCCL2 or policy can change those branches: re-capture under it.",
            "[scenario]",
            f"name = {_toml(name)}",
        ]
        if self.policy is not None:  # the Programs hold its decisions: replayed as decided, with its env knobs
            lines.append(f"policy = {_toml(_policy_spec(as_captured_spec(self.policy)))}")
        if description:
            lines.append(f"description = {_toml(description)}")
        lines += [
            "",
            "[cluster]",
            f"gpu = {_toml(gpu)}",
            f"nodes = {self.nodes}",
            f"gpus_per_node = {self.gpus_per_node}",
            "",
            "[torch]",
            f"release = {_toml(self.release)}",
        ]
        if self.env:
            pairs = ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in sorted(self.env.items()))
            lines.append(f"env = {{ {pairs} }}")
        unmodelled = unmodelled_options(self.programs)
        if unmodelled:
            lines += ["", f"# {_unmodelled_text(unmodelled)}"]
        lines += ["", "[workload]", "steps = ["]
        for op in groups[0][0].ops[:prefix]:
            lines.append(f"  {_step(op, None)},")
        for program, ranks in groups:
            on_ranks = None if len(groups) == 1 else ranks
            for op in program.ops[prefix:]:
                lines.append(f"  {_step(op, on_ranks)},")
        lines.append("]")
        return "\n".join(lines) + "\n"


def _program_ranks(programs: Sequence[Program]) -> list[tuple[Program, list[int]]]:
    """Distinct programs in first-rank order, each with the ranks that run it."""
    out: dict[int, tuple[Program, list[int]]] = {}
    for rank, program in enumerate(programs):
        out.setdefault(id(program), (program, []))[1].append(rank)
    return list(out.values())


def _call_ranks(calls: Sequence[tuple[Call, ...]]) -> list[tuple[tuple[Call, ...], list[int]]]:
    """Distinct call lists (shared objects, as ``capture`` assembles them) in first-rank order, with their ranks."""
    out: dict[int, tuple[tuple[Call, ...], list[int]]] = {}
    for rank, rank_calls in enumerate(calls):
        out.setdefault(id(rank_calls), (rank_calls, []))[1].append(rank)
    return list(out.values())


def unmodelled_options(programs: Sequence[Program]) -> list[str]:
    """The pg_options fields these programs set that the simulator does not use yet, in field order."""
    seen: set[str] = set()
    for program in {id(p): p for p in programs}.values():
        for op in program.ops:
            options = getattr(op, "pg_options", NO_OPTIONS)
            if options is not NO_OPTIONS:
                seen.update(options.unmodelled())
    return [name for name in OPTION_FIELDS if name in seen]


def _unmodelled_text(names: Sequence[str]) -> str:
    return (
        f"pg_options recorded but not modelled by the simulator yet: {', '.join(names)} "
        "(kept in the Programs; they change nothing in a simulation)"
    )


def _common_prefix(op_lists: Sequence[Sequence[Op]]) -> int:
    if len(op_lists) == 1:
        return len(op_lists[0])
    n = min(len(ops) for ops in op_lists)
    for i in range(n):
        if any(ops[i] != op_lists[0][i] for ops in op_lists[1:]):
            return i
    return n


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")  # pragma: no cover - ops hold plain values only


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: other characters as they are, control characters (and DEL) escaped.

    Why not ``json.dumps``: it writes a character outside the Basic Multilingual Plane (``group_desc="tp😀"``) as
    a surrogate pair, ``\\ud83d\\ude00``, which TOML forbids: the scenario written was refused by ``simnccl run``,
    and ``--simulate`` ended in an internal error. A lone surrogate is no character TOML can hold: refused."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise CaptureError(f"the captured value {text!r} holds a lone surrogate, which a TOML scenario cannot hold")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _step(op: Op, on_ranks: Sequence[int] | None) -> str:
    fields = op.to_dict()
    name = fields.pop("op")
    items = [f"op = {_toml(name)}"]
    for key, value in fields.items():
        if key == "pg_options":
            items += [f"{k} = {_toml(v)}" for k, v in value.items()]
        elif key == "label":
            items.append(f"name = {_toml(value)}")
        else:
            items.append(f"{key} = {_toml(value)}")
    if on_ranks is not None:
        items.append(f"on_ranks = {_toml(list(on_ranks))}")
    return "{ " + ", ".join(items) + " }"
