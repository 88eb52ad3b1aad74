"""``[[variants]]``/``[matrix]`` pieces: release, policy, profile, cluster and env checks, and the matrix product.

Why here: a variant is the only place a release, a profile and an environment meet, so their agreement (a
profile covers the release; NCCL knobs parse under it) is checked before any simulation runs.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simnccl.cluster import Cluster, ClusterError, get_gpu_kind
from simnccl.env_knobs import unknown_knob_message, value_problem
from simnccl.limits import InputLimits, exceeded, file_problem
from simnccl.limits import current as current_limits
from simnccl.policy import PolicyError, get_policy
from simnccl.profiles import Profile, ProfileError, find_profile, get_profile
from simnccl.release import RELEASES
from simnccl.scenario.model import ScenarioError, Variant
from simnccl.scenario.reader import Reader, brief, first_repeat, str_list
from simnccl.visible_text import invisible_in

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")  # what torch and NCCL read: upper case, as written


@dataclass(frozen=True, slots=True)
class MatrixBase:
    """What every [matrix] variant starts from: the scenario's own release, policy, env and profile."""

    release: str
    policy: str
    env: Mapping[str, str]
    profile_ref: str | None
    cluster: Cluster
    base_dir: Path | None
    extra_knobs: tuple[str, ...]


def _distinct(source: str, key: str, values: Sequence[str]) -> None:
    """An axis names each value once: a value given twice made two variants of one name, reported as "also
    defined in [[variants]]" in a file that had none."""
    twice = first_repeat(values)
    if twice is not None:
        raise ScenarioError(source, key, f"{brief(twice[0])} is given twice; each value of an axis is one variant")


def matrix_variants(reader: Reader, base: MatrixBase, room: int) -> list[Variant]:
    """``[matrix]``: the cartesian product of ``release``, ``policy`` and each ``env`` variable's values.

    Variants are named ``axis=value,...`` over the axes with more than one value, in the order written. The
    product's size is checked against ``max_variants`` (``room`` is what [[variants]] left) before it is taken.

    A matrix that names no axis (an empty ``[matrix]``, or only ``env = {}``) is refused, as an ``[[expect]]``
    that asserts nothing is: it added one variant named "matrix", the scenario's own settings under another
    name, so ``[[expect]]`` tables naming "default" no longer matched and a typo'd or forgotten axis went unseen.
    """
    axes: list[tuple[str, list[str]]] = []
    for key in ("release", "policy"):
        values = reader.get(key, list, [getattr(base, key)], what="a list of strings")
        if not values or not all(isinstance(v, str) for v in values):
            raise reader.error(key, f"expected a non-empty list of strings, got {brief(values)}")
        _distinct(reader.source, f"matrix.{key}", values)
        for value in values:
            if key == "release" and value not in RELEASES:
                raise reader.error(key, f"unknown torch release {brief(value)}; expected one of {', '.join(RELEASES)}")
            if key == "policy":
                check_policy(reader, key, value)
        axes.append((key, values))
    env_axes = reader.get("env", dict, {}, what="a table of environment variables to lists of strings")
    for var, values in env_axes.items():
        key = f"matrix.env.{var}"
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise ScenarioError(reader.source, key, f"expected a non-empty list of strings, got {brief(values)}")
        check_knob(reader.source, key, var, base.extra_knobs)
        _distinct(reader.source, key, values)
        for value in values:
            problem = value_problem(var, value)
            if problem is not None:
                raise ScenarioError(reader.source, key, problem)
            bad = invisible_in(value)  # the value names its variant ("NCCL_DEBUG=INFO"): one line, as a name is
            if bad is not None:
                raise ScenarioError(
                    reader.source,
                    key,
                    f"expected a value on one line without control characters, got {bad} in {brief(value)}",
                )
        axes.append((var, values))
    reader.finish()
    if "release" not in reader.table and "policy" not in reader.table and not env_axes:
        raise ScenarioError(
            reader.source, "matrix", "varies nothing; expected release, policy or env (a list of values each)"
        )
    size = math.prod(len(values) for _, values in axes)
    if size > room:
        shown = " x ".join(str(len(values)) for _, values in axes)
        limit = current_limits().max_variants
        others = f" beside {limit - room} [[variants]]" if room < limit else ""
        raise ScenarioError(
            reader.source, "matrix", exceeded("max_variants", f"{shown} = {size} variants{others}", limit)
        )
    named = [name for name, values in axes if len(values) > 1]
    cluster = base.cluster
    out = []
    for combo in itertools.product(*(values for _, values in axes)):
        chosen = dict(zip((name for name, _ in axes), combo, strict=True))
        env = {**base.env, **{k: v for k, v in chosen.items() if k not in ("release", "policy")}}
        v_release = chosen["release"]
        profile = read_profile(
            reader.source, "matrix.release", base.profile_ref, cluster.gpu.key, v_release, base.base_dir
        )
        check_env(reader.source, "matrix.env", profile, env)
        name = ",".join(f"{k}={chosen[k]}" for k in named) or "matrix"
        out.append(Variant(name, "", v_release, profile, env, chosen["policy"]))
    return out


def check_policy(reader: Reader, key: str, spec: str) -> None:
    try:
        get_policy(spec)
    except PolicyError as err:
        raise reader.error(key, str(err)) from None


def read_policy(reader: Reader, key: str, default: str) -> str:
    value = reader.get(key, str, default)
    check_policy(reader, key, value)
    return value


def read_release(reader: Reader, key: str, default: Any = ...) -> str:
    value = reader.get(key, str, default)
    if value not in RELEASES:
        raise reader.error(key, f"unknown torch release {brief(value)}; expected one of {', '.join(RELEASES)}")
    return value


def read_cluster(reader: Reader, limits: InputLimits) -> Cluster:
    """The cluster, after its size is checked against ``max_world_size`` (ranks and GPUs), before any is made."""
    gpu_key = reader.get("gpu", str)
    try:
        gpu = get_gpu_kind(gpu_key)
    except ClusterError as err:
        raise reader.error("gpu", str(err)) from None
    nodes = reader.get("nodes", int, 1)
    gpus = reader.get("gpus_per_node", int)
    ranks = reader.get("ranks_per_node", int, None)
    reader.finish()
    if nodes >= 1 and gpus >= 0 and (ranks is None or ranks >= 1):
        for what, count in (("GPUs", nodes * gpus), ("ranks", nodes * (gpus if ranks is None else ranks))):
            if count > limits.max_world_size:
                shown = f"{count} {what} (nodes x {'gpus_per_node' if what == 'GPUs' else 'ranks per node'})"
                raise ScenarioError(reader.source, "cluster", exceeded("max_world_size", shown, limits.max_world_size))
    try:
        return Cluster(gpu, nodes, gpus, ranks)
    except ClusterError as err:
        raise ScenarioError(reader.source, "cluster", str(err)) from None


def read_profile(source: str, key: str, ref: str | None, gpu: str, release: str, base_dir: Path | None) -> Profile:
    try:
        if ref is None:
            return find_profile(gpu, release)
        candidate = (base_dir / ref) if base_dir is not None and ref.endswith(".toml") else None
        if candidate is not None or os.sep in ref:  # a file, not a built-in name: only a regular, small one
            problem = file_problem(candidate or Path(ref), current_limits().max_file_bytes)
            if problem is not None:
                raise ScenarioError(source, key, f"profile file {brief(str(candidate or ref))}: {problem}")
        profile = get_profile(str(candidate) if candidate is not None else ref)
    except ProfileError as err:
        raise ScenarioError(source, key, str(err)) from None
    if profile.gpu != gpu:
        raise ScenarioError(source, key, f"profile {profile.name!r} is for GPU {profile.gpu!r}, cluster has {gpu!r}")
    if release not in profile.releases:
        raise ScenarioError(
            source,
            key,
            f"profile {profile.name!r} does not cover torch release {release!r} "
            f"(it covers {', '.join(profile.releases)}); name a profile for that release or omit it",
        )
    return profile


def check_env(source: str, key: str, profile: Profile, env: Mapping[str, str]) -> None:
    """Validate the NCCL knobs the engine's memory model parses here: bad input is never a traceback."""
    try:
        profile.check_env(env)
    except ProfileError as err:
        raise ScenarioError(source, f"{key}.{err.knob}" if err.knob else key, str(err)) from None


def check_knob(source: str, key: str, name: str, extra: Sequence[str]) -> None:
    message = unknown_knob_message(name, extra)
    if message is not None:
        raise ScenarioError(source, key, message)


def read_extra_knobs(reader: Reader) -> tuple[str, ...]:
    """``[torch] extra_env_knobs``: knob names newer than simnccl's list, each an upper-case environment variable
    name (``ENV_NAME``). Why: environment variables are case-sensitive and torch and NCCL read theirs in upper
    case, so a declared ``nccl_new`` was accepted, and the env tables that set it changed nothing in production."""
    names = str_list(reader, "extra_env_knobs", "a list of environment variable names") or ()
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise reader.error(
                "extra_env_knobs",
                f"expected upper-case environment variable names (A-Z, 0-9 and _, not starting with a digit: "
                f"torch and NCCL read theirs as written), got {brief(name)}",
            )
    return names
