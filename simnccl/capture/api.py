"""``capture()`` and ``capture_scaled()``: the public entry points, and assembling ranks into a ``CapturedRun``."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.distributed as dist

from simnccl.capture.divergence import divergence_note
from simnccl.capture.environment import DEFAULT_GPU
from simnccl.capture.intercept import _intercepted
from simnccl.capture.ranks import BRANCH_KNOBS, _run_forked, _run_inline, _Spec, option_sets
from simnccl.capture.result import (
    Call,
    CapturedRun,
    CaptureError,
    RankCapture,
    _plain_policy,
    _ranks_text,
    _unmodelled_text,
    unmodelled_options,
)
from simnccl.capture_cli import DEFAULT_TIMEOUT_S, MODES, world_problem
from simnccl.cli_options import seconds_problem
from simnccl.cluster import ClusterError, get_gpu_kind
from simnccl.env_knobs import LAUNCHER_VARIABLES, env_problem, is_env_name, simulated_knobs
from simnccl.limits import current as current_limits
from simnccl.limits import exceeded
from simnccl.nccl.knobs import same_to_the_model
from simnccl.ops import (
    InitProcessGroup,
    Program,
)
from simnccl.release import ReleaseError, get_release, resolve_backend
from simnccl.visible_text import invisible_in


def capture(
    target: Callable[[], Any],
    world_size: int,
    *,
    gpus_per_node: int | None = None,
    release: str = "2.15",
    env: Mapping[str, str] | None = None,
    backend: str | None = None,
    device_type: str = "cuda",
    mode: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    jobs: int | None = None,
    checkpoints: bool = True,
    final_checkpoint: str | None = "end",
    policy: str | None = None,
    step: Callable[[Any], Any] | None = None,
    gpu: str = DEFAULT_GPU,
) -> CapturedRun:
    """Run ``target()`` once per simulated rank of a ``world_size`` world and return every rank's Program.

    ``gpus_per_node`` (default: the largest divisor of ``world_size`` up to 8) sets ``LOCAL_RANK`` and the
    CUDA device count. Each rank sees the environment torchrun would give it (``env_knobs.torchrun_env``:
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` ...) plus
    ``env``. ``backend``: call ``init_process_group(backend)`` before ``target`` (for code that expects an
    initialised world); None: the target initialises it. ``release``/``env`` pick the emulated torch release's
    device binding and backend names (``TORCH_DIST_USE_NCCL2``). ``device_type="cuda"`` stands in for the CUDA
    queries (``"cpu"``: leave torch.cuda alone). ``checkpoints`` adds ``after_init`` after
    ``init_process_group`` (``after_init_2`` after a re-init, and so on); a
    ``final_checkpoint`` is appended after the target returns. ``policy`` (a spec such as ``"lazy-init"``):
    each rank runs under ``simnccl.torch_apply.apply(policy)``, so the Programs are what real torch runs
    under it; the run remembers the release, env and policy its branches depended on (``check_replay``).
    ``step``: the first training step, called with what ``target()`` returned (its model, optimizer, batch)
    after startup, between checkpoints ``startup`` and ``step1``: its tensors (forward, backward, optimizer
    state, on emulated CUDA devices: ``simnccl.capture.fake_devices``) and its collectives are recorded, so
    lazy communicators pay their first use and the step-1 peak is simulated. ``gpu``: the GPU kind
    ``torch.cuda.get_device_properties``/``mem_get_info`` describe to the code, and ``simulate``'s default.
    """
    if not callable(target):
        raise CaptureError(f"expected a callable to capture, got {type(target).__name__} {target!r}")
    if step is not None and not callable(step):
        raise CaptureError(f"step: expected a callable taking the target's return value, got {step!r}")
    try:
        get_gpu_kind(gpu)
    except ClusterError as err:
        raise CaptureError(f"gpu: {err}") from None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CaptureError(f"world_size: expected an integer >= 1, got {world_size!r}")
    too_large = world_problem(world_size)
    if too_large is not None:
        raise CaptureError(f"world_size: {too_large}")
    per_node = max(d for d in range(1, 9) if world_size % d == 0) if gpus_per_node is None else gpus_per_node
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise CaptureError(f"gpus_per_node: expected an integer >= 1, got {gpus_per_node!r}")
    if world_size % per_node:
        raise CaptureError(
            f"gpus_per_node: expected a divisor of the world size {world_size} (whole nodes), got {per_node}"
        )
    try:
        get_release(release)
    except ReleaseError as err:
        raise CaptureError(f"release: {err}") from None
    if env is not None and not isinstance(env, Mapping):
        raise CaptureError(f"env: expected a mapping of variable names to strings, got {type(env).__name__}")
    for name, value in (env or {}).items():  # set in each rank's os.environ: text, under a variable's name
        if not isinstance(name, str) or not isinstance(value, str) or not is_env_name(name) or "\x00" in value:
            # (a NUL byte cannot be in an environment: every rank failed setting it, blamed on the captured code)
            raise CaptureError(f"env: expected variable names and string values, got {name!r}: {value!r}")
    # (env_problem below refuses these too; this says it in the capture's words, naming every one given)
    clash = [name for name in LAUNCHER_VARIABLES if name in (env or {})]
    if clash:
        raise CaptureError(
            f"env: {', '.join(clash)} is set by the capture for each rank, as torchrun sets it; the world's shape "
            "comes from world_size and gpus_per_node (--world, --gpus-per-node)"
        )
    for name, value in (env or {}).items():  # a misspelt knob captured torch's default branch (as --env is checked)
        problem = env_problem(
            name, value, (), "set a newer one in this process's environment, which every rank inherits"
        )
        if problem is not None:
            raise CaptureError(f"env: {name}: {problem}")
    if backend is not None:  # one torch knows: else every rank failed as "the captured code raised"
        if not isinstance(backend, str):
            raise CaptureError(f"backend: expected a backend name such as 'nccl' or 'gloo', got {backend!r}")
        try:
            resolve_backend(get_release(release), backend, dict(env or {}))
        except ReleaseError as err:
            raise CaptureError(f"backend: {err}") from None
    if final_checkpoint is not None and (
        not isinstance(final_checkpoint, str) or not final_checkpoint.strip() or invisible_in(final_checkpoint)
    ):
        raise CaptureError(
            f"final_checkpoint: expected a name on one line without control characters, got {final_checkpoint!r}"
        )
    if device_type not in ("cuda", "cpu"):
        raise CaptureError(f"device_type: expected 'cuda' or 'cpu', got {device_type!r}")
    chosen = mode if mode is not None else ("fork" if hasattr(os, "fork") else "inline")
    if chosen not in MODES:
        raise CaptureError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise CaptureError(f"jobs: expected an integer >= 1 (ranks run at a time), got {jobs!r}")
    if jobs is not None and jobs > (limit := current_limits().max_capture_jobs):
        raise CaptureError(f"jobs: {exceeded('max_capture_jobs', f'{jobs} ranks at a time', limit)}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise CaptureError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    try:
        timeout_problem = seconds_problem(float(timeout_s))
    except OverflowError:  # an integer past float's range (10**400): no wall-clock limit either
        timeout_problem = f"expected a positive number of seconds, got an integer of {len(str(timeout_s))} digits"
    if timeout_problem is not None:
        raise CaptureError(f"timeout_s: {timeout_problem}")
    policy = _plain_policy(policy)
    if policy is not None:
        from simnccl.policy import PolicyError, get_policy

        try:
            get_policy(policy)
        except PolicyError as err:
            raise CaptureError(f"policy: {err}") from None
    if dist.is_initialized():
        raise CaptureError("a default process group already exists in this process; destroy it before capturing")
    shadows = getattr(target, "shadows_torch_imports", None)
    if callable(shadows) and (found := shadows()):
        raise CaptureError(found)
    spec = _Spec(
        target=target,
        world_size=world_size,
        gpus_per_node=per_node,
        release=release,
        env=dict(env or {}),
        init_backend=backend,
        cuda=device_type == "cuda",
        checkpoints=checkpoints,
        final_checkpoint=final_checkpoint,
        timeout_s=float(timeout_s),
        policy=policy,
        step=step,
        gpu=gpu,
    )
    started = time.monotonic()
    run_notes: list[str] = []
    try:
        with _intercepted():  # once, for every rank and either mode (see _intercepted)
            if chosen == "fork":
                import tempfile

                from simnccl.capture.forkserver import start_forks

                with tempfile.TemporaryDirectory(prefix="simnccl-capture-") as log_dir:
                    forks, run_notes = start_forks(spec, log_dir)
                    ranks = _run_forked(spec, max(1, jobs or os.cpu_count() or 1), log_dir, forks)
            else:
                ranks = _run_inline(spec)
    except CaptureError as err:
        if policy is None:
            raise
        raise CaptureError(
            f"{err}\n  note: the ranks ran under policy {policy!r} (simnccl.torch_apply.apply, as production "
            f"would), emulating torch {release}: the captured code meets what real torch does under that policy"
        ) from None
    return _assemble(spec, ranks, chosen, time.monotonic() - started, run_notes)


def capture_scaled(target: Callable[[], Any], world_sizes: Sequence[int], **kwargs: Any) -> dict[int, CapturedRun]:
    """Capture the same code at several world sizes: the code is what scales, so each world is re-run."""
    return {w: capture(target, w, **kwargs) for w in world_sizes}


def _assemble(
    spec: _Spec, ranks: Sequence[RankCapture], mode: str, wall_s: float, run_notes: Sequence[str] = ()
) -> CapturedRun:
    """The run: ranks with identical ops share one Program object (DESIGN rule 8), as in a generated case, and
    ranks with identical calls one tuple of calls.

    Forked ranks arrive with equal parts already shared (``ranks._Results``), so the comparisons here run once
    per distinct object, not once per rank.
    """
    from simnccl.testing.replay import share_identical  # see _deadline: the simulator, imported when needed

    distinct_ops = {id(r.ops): r.ops for r in ranks}
    canonical = dict(zip(distinct_ops, share_identical(list(distinct_ops.values())), strict=True))
    shared: dict[int, Program] = {}
    programs = tuple(shared.setdefault(id(canonical[id(r.ops)]), Program(canonical[id(r.ops)])) for r in ranks)
    calls = _shared_calls([r.calls for r in ranks])
    notes: list[str] = []
    for r in ranks:
        for note in (*r.notes, *run_notes):
            if note not in notes:
                notes.append(note)
    if not any(isinstance(op, InitProcessGroup) for p in shared.values() for op in p.ops):
        notes.append("no rank called init_process_group: nothing distributed was captured")
    diverging = divergence_note(programs)
    if diverging:
        notes.append(diverging)
    unmodelled = unmodelled_options(list(shared.values()))
    if unmodelled:
        notes.append(_unmodelled_text(unmodelled))
    env = dict(spec.env)
    _refuse_branch_knobs(spec.release, env, ranks)
    notes += _code_set_knobs(env, ranks, lambda: option_sets(op for p in shared.values() for op in p.ops))
    return CapturedRun(
        world_size=spec.world_size,
        gpus_per_node=spec.gpus_per_node,
        release=spec.release,
        env=env,
        programs=programs,
        calls=calls,
        notes=tuple(notes),
        mode=mode,
        wall_s=wall_s,
        policy=spec.policy,
        gpu=spec.gpu,
    )


def _refuse_branch_knobs(release: str, env: Mapping[str, str], ranks: Sequence[RankCapture]) -> None:
    """CaptureError where the captured code chose another NCCL implementation for itself than the capture emulated:
    it set ``TORCH_DIST_USE_NCCL2`` (``ranks.BRANCH_KNOBS``) before its first call naming "nccl", where real torch
    reads it (legacy or nccl2), while the capture's ranks ran under the environment they started with. Why
    refused, not noted: the Programs are then another branch of the code than production takes, and a rank that
    picked legacy among nccl2 peers passed as one of them (found by a tester: exit 0). One set to a value that
    picks the same implementation changes nothing, and is left out (``_code_set_knobs``)."""
    rel = get_release(release)
    started = rel.nccl_impl(env)
    changed: dict[tuple[str, str | None], list[int]] = {}
    for capture in ranks:
        for name, value, _ in capture.env_set:
            if name not in BRANCH_KNOBS:
                continue
            if _chosen(rel, env, name, value) != started:
                changed.setdefault((name, value), []).append(capture.rank)
    if not changed:
        return
    (name, value), where = next(iter(changed.items()))
    setting = f"set {name}={value}" if value is not None else f"removed {name}"
    everyone = len(changed) == 1 and len(where) == len(ranks)
    fix = (
        f"capture again with it in the environment every rank starts with (--env {name}={value}, "
        f"capture(env={{{name!r}: {value!r}}}))"
        if everyone and value is not None
        else "ranks that pick different NCCL implementations cannot make groups together on real torch: set it "
        "alike on every rank, then capture with it in the environment (--env)"
    )
    raise CaptureError(
        f"the captured code {setting} in os.environ before its first use of 'nccl' on rank(s) "
        f"{_ranks_text(where)}: real torch reads it at the first use of 'nccl' in the process, and it picks "
        f"{_chosen(rel, env, name, value)} there, not the {started} this capture emulated from the environment the "
        f"ranks started with; {fix}"
    )


def _chosen(rel: Any, env: Mapping[str, str], name: str, value: str | None) -> Any:
    """The implementation "nccl" picks with ``name`` set to ``value`` (None: removed) in ``env``."""
    changed = {k: v for k, v in env.items() if k != name}
    if value is not None:
        changed[name] = value
    return rel.nccl_impl(changed)


def _code_set_knobs(
    env: dict[str, str],
    ranks: Sequence[RankCapture],
    configs: Callable[[], Sequence[Mapping[str, Any]]] = lambda: ({},),
) -> list[str]:
    """Put into ``env`` (the run's, which its simulation and written scenario use) the NCCL knobs the captured code
    set in ``os.environ`` itself (``RankCapture.env_set``) alike on every rank; the notes that say so, and name
    the ones simulated without: set to a value simnccl cannot use, or set differently by the ranks (or changed
    after ``init_process_group``) where the simulation does not read them; one it reads is refused
    (``_refuse_per_rank_knob``).

    Why: the code's own ``os.environ["NCCL_..."] = ...`` before its groups (SGLang's server sets NCCL_CUMEM_ENABLE
    and NCCL_NVLS_ENABLE to 0 so, in ``_set_envs_and_config``) is what NCCL reads when it makes them; the capture
    restored the environment after each rank and simulated without it (a rank sharing a GPU with
    NCCL_MULTI_RANK_GPU_ENABLE=1 set in the script failed)."""
    per_rank = [
        {name: (value, settled) for name, value, settled in r.env_set if name not in BRANCH_KNOBS} for r in ranks
    ]
    names = sorted({name for changes in per_rank for name in changes})
    if not names:
        return []
    notes, merged, skipped = [], [], []
    for name in names:
        values = {changes.get(name, (env.get(name), True))[0] for changes in per_rank}
        value = next(iter(values))
        problem = None if value is None else _unusable(name, value)
        unsettled = [
            r.rank for r, changes in zip(ranks, per_rank, strict=True) if not changes.get(name, (None, True))[1]
        ]
        if unsettled or len(values) > 1:
            # values that mean the same to NCCL's model under every config the run's groups use are one value
            # (``configs``: what its groups ask for; a rank's own moments were compared so in ``knobs_set_by_code``)
            if name in simulated_knobs() and (unsettled or not same_to_the_model(name, values, configs())):
                _refuse_per_rank_knob(name, env, ranks, per_rank, unsettled)
            problem = (
                "changed between init_process_group and the first collective: which value NCCL read depends on "
                "when it made its communicator"
                if unsettled
                else "ranks set it differently"
            )
        if problem is not None:
            skipped.append(f"{name}={value} ({problem})" if len(values) == 1 else f"{name} ({problem})")
            continue
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
        merged.append(f"{name}={value}" if value is not None else f"{name} removed")
    if merged:
        notes.append(
            f"the captured code set {', '.join(merged)} in os.environ: simulated with it, as NCCL reads it when it "
            "makes a communicator (a written scenario has it in [torch] env)"
        )
    if skipped:
        notes.append(f"the captured code set {', '.join(skipped)} in os.environ: simulated without it")
    return notes


def _refuse_per_rank_knob(
    name: str,
    env: Mapping[str, str],
    ranks: Sequence[RankCapture],
    per_rank: Sequence[Mapping[str, tuple[str | None, bool]]],
    unsettled: Sequence[int],
) -> None:
    """CaptureError for a knob the simulation reads (``env_knobs.simulated_knobs``) that the captured code set to
    different values on different ranks, or changed between ``init_process_group`` and its first collective.

    Why refused, not simulated without it: simnccl simulates one environment for every rank, and NCCL reads such a
    knob when it makes each rank's communicators (at init for an eager one, at its first use for a lazy one). Left
    out, a rank whose code set ``NCCL_RUNTIME_CONNECT=0`` (every connection made at init: gigabytes more) was
    simulated as its peers and passed (found by a tester: exit 0 with a note)."""
    if unsettled:
        raise CaptureError(
            f"the captured code changed {name} in os.environ between init_process_group and its first collective "
            f"on rank(s) {_ranks_text(unsettled)}: NCCL reads it when it makes a communicator (at init for an eager "
            "one, at its first use for a lazy one), and simnccl simulates one value for the whole run; set it once, "
            "before init_process_group"
        )
    by_value: dict[str | None, list[int]] = {}
    for capture, changes in zip(ranks, per_rank, strict=True):
        by_value.setdefault(changes.get(name, (env.get(name), True))[0], []).append(capture.rank)
    values = "; ".join(
        f"rank(s) {_ranks_text(where)}: {'not set' if value is None else repr(value)}"
        for value, where in by_value.items()
    )
    raise CaptureError(
        f"the captured code set {name} in os.environ differently on different ranks ({values}): NCCL reads it when it "
        "makes each rank's communicators, and simnccl simulates one environment for every rank; set it alike on "
        f"every rank, or take it out of the code and capture with --env {name}=VALUE"
    )


def _unusable(name: str, value: str) -> str | None:
    """Why simnccl cannot simulate knob ``name`` at ``value`` (as a run's ``--env`` or a scenario's env table is
    checked, and as NCCL's memory model parses it), or None. NCCL itself warns of a value it cannot parse and goes on
    with its default, so such a knob is left out of the run, named, not a refused simulation."""
    from simnccl.env_knobs import env_problem
    from simnccl.nccl.constants import NcclInputError
    from simnccl.nccl.knobs import settings_from

    problem = env_problem(name, value)
    if problem is not None:
        return problem
    try:
        settings_from({name: value})
    except NcclInputError as err:
        return str(err).removeprefix(f"{name}: ")
    return None


def _shared_calls(per_rank: Sequence[tuple[Call, ...]]) -> tuple[tuple[Call, ...], ...]:
    """One tuple per distinct list of calls, reused by every rank that made those calls (calls hold dicts, so
    equal lists are found by their pickled form, once per distinct object)."""
    by_id: dict[int, tuple[Call, ...]] = {}
    by_value: dict[bytes, tuple[Call, ...]] = {}
    out = []
    for calls in per_rank:
        if id(calls) not in by_id:
            key = pickle.dumps(calls, pickle.HIGHEST_PROTOCOL)
            by_id[id(calls)] = by_value.setdefault(key, calls)
        out.append(by_id[id(calls)])
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simnccl.capture``: the same command as ``simnccl capture`` (``simnccl.capture_cli``), under
    the same guard (``simnccl.cli_guard``): a crash exits 70 and an unwritable output 2, never 1 (a failed
    check) with a traceback, and Ctrl-C exits 130 with what finished."""
    from simnccl.capture_cli import main as cli_main
    from simnccl.cli_guard import guarded

    return guarded(cli_main, command=("capture",))(argv)
