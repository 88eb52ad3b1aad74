"""The options every simnccl command shares, defined once: scenario overrides, output options, ``--version``.

Why one module: a flag that means one thing in ``run`` and another (or nothing) in ``cost`` is a trap, and a
command added later (``sweep``) must get the same flags by calling ``add_common(parser)``, not by copying them.
``simnccl run``, ``explain``, ``cost``, ``capture``, ``real run`` and ``real compare`` take every override;
``real diff`` takes ``--seed``; every command takes the output options.

Overrides are applied to a validated Scenario (``apply_overrides``) and checked the way scenario input is:
a bad value raises ``OverrideError``, whose message starts with the flag (exit 2), never a traceback. Nothing
here imports torch or the engine: ``simnccl capture --help`` builds its parser from this module alone.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from simnccl import __version__
from simnccl.release import RELEASES

OVERRIDE_FLAGS = ("--policy", "--release", "--gpu", "--seed", "--env", "--variant")
OUTPUT_FLAGS = ("--json", "--quiet", "--version")
STDOUT = "-"  # --json without FILE (or with "-"): the document goes to stdout instead of the text

_OVERRIDE_HELP = {
    "--policy": "run every variant under policy SPEC (a built-in such as dedupe, a composition a+b, budget(N), "
    "or an import spec pkg.mod:Obj); repeatable: each variant then runs once per SPEC, named VARIANT,policy=SPEC",
    "--release": f"emulate this torch release instead of the scenario's ({', '.join(RELEASES)})",
    "--gpu": "GPU kind instead of the scenario's (e.g. h100-80gb; the profile follows the GPU)",
    "--seed": "the run's seed; a scenario whose [faults] has a seed draws its fault swarm from this one",
    "--env": "set an environment variable for every variant (repeatable)",
    "--variant": "run only this variant (repeatable; in the order given)",
}


class UsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: ``simnccl sweep: error: MESSAGE (see simnccl sweep
    --help)``, exit 2. Why: bad input is one line (DESIGN rule 11); argparse printed the whole usage first (eleven
    lines for ``sweep``), so in a CI log the error was the last of a wall of flags. Subcommand parsers made with
    ``add_subparsers`` are of the same class, so every command of a tree built on it answers alike; ``--help``
    is untouched."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # An option that takes one value refuses a second one (``_StoreOnce``); registered, so that its argument
        # groups (which share this registry) and its commands' parsers (of this class) do so too.
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)


class _StoreOnce(argparse._StoreAction):
    """A one-value option given twice is refused (exit 2), not the last one kept as argparse does.

    Why: ``--world 4 ... --world 8`` in a CI script (a flag repeated by a wrapper, a variable expanded twice) ran
    with 8 and said nothing; which value the user meant is theirs to say. The options already seen are kept on the
    namespace being filled (so one parse's are not another's)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        given: set[str] = namespace.__dict__.setdefault(_GIVEN, set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given twice; give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


_GIVEN = "_options_given"  # where _StoreOnce keeps, on a namespace, the options it stored


class OutputError(Exception):
    """An output file could not be written (a full disk, a folder gone, no permission): exit 2 naming the flag
    and the file, not an internal error (exit 70)."""


class ClosedStdout(io.TextIOWrapper):
    """What a command started with stdout closed (``>&-``) writes its text to: nowhere (``cli_guard`` puts it
    there). A document meant for stdout is bad input instead (``cli_output.document_owns_stdout``)."""


class OverrideError(ValueError):
    """A command-line override that cannot apply: the message names the flag (exit 2)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def seconds_problem(value: float, shown: str | None = None) -> str | None:
    """Why ``value`` may not be a wall-clock timeout in seconds (None: it may): not finite, not positive, or
    past ``max_timeout_s`` (``simnccl/data/limits.toml``). ``shown``: the value as the user wrote it."""
    import math

    from simnccl.limits import LimitError, exceeded
    from simnccl.limits import current as current_limits

    if not math.isfinite(value) or value <= 0:
        return f"expected a positive number of seconds, got {shown if shown is not None else value!r}"
    try:
        limit = current_limits().max_timeout_s
    except LimitError as err:
        return str(err)
    if value > limit:
        return exceeded("max_timeout_s", f"{shown if shown is not None else f'{value:g}'} s", limit)
    return None


def seconds(text: str) -> float:
    """argparse ``type`` of a wall-clock flag (``--timeout``, ``--stall``): a bad value is a one-line usage error
    (exit 2) naming the flag, never a run that fails (exit 1) or an overflow deep in a launcher (exit 70)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    problem = seconds_problem(value, text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def factor(text: str) -> float:
    """argparse ``type`` of a finite, non-negative multiplier (``--compute-scale``)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def version_text() -> str:
    return f"simnccl {__version__}"


def env_item(text: str) -> tuple[str, str]:
    """``--env VAR=VALUE`` -> (VAR, VALUE); argparse turns the error into exit 2 naming ``--env``."""
    name, sep, value = text.partition("=")
    if not sep or not name or name != name.strip() or "\x00" in text:
        raise argparse.ArgumentTypeError(f"expected VAR=VALUE, got {text!r}")
    from simnccl.env_knobs import is_env_name  # imported where used, as env_overrides does

    if not is_env_name(name):  # a newline in it printed the report's line as two
        raise argparse.ArgumentTypeError(f"expected VAR=VALUE with VAR a variable name, got {text!r}")
    return name, value


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=version_text(), help="print simnccl's version")


def add_overrides(
    parser: argparse.ArgumentParser,
    flags: Iterable[str] = OVERRIDE_FLAGS,
    help: Mapping[str, str] | None = None,
) -> None:
    """The override flags (all by default), under one heading; ``help`` rewords a flag for this command."""
    texts = {**_OVERRIDE_HELP, **(help or {})}
    group = parser.add_argument_group("overrides (the same flags in every simnccl command)")
    chosen = set(flags)
    unknown = chosen - set(OVERRIDE_FLAGS)
    if unknown:
        raise ValueError(f"unknown override flags {sorted(unknown)}")
    specs: dict[str, dict[str, Any]] = {
        "--policy": {"action": "append", "metavar": "SPEC"},
        "--release": {"metavar": "RELEASE"},
        "--gpu": {"metavar": "KIND"},
        "--seed": {"type": int, "metavar": "N"},
        "--env": {"action": "append", "type": env_item, "metavar": "VAR=VALUE", "default": []},
        "--variant": {"action": "append", "metavar": "NAME"},
    }
    for flag in OVERRIDE_FLAGS:
        if flag in chosen:
            group.add_argument(flag, help=texts[flag], **specs[flag])


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--json [FILE]``, ``--quiet``, ``--version``: where the one JSON document goes, and how much text."""
    group = parser.add_argument_group("output (the same flags in every simnccl command)")
    group.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        metavar="FILE",
        help="write the result as one JSON document (schema in README): to FILE, or without FILE (or with '-') "
        "to stdout instead of the text; a scenario (.toml) or script (.py) right after --json is an input, not FILE",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="one line per variant (scenario, variant, verdict, ok/FAIL, key figure) and no progress bar",
    )
    group.add_argument("--version", action="version", version=version_text(), help="print simnccl's version")


def add_common(
    parser: argparse.ArgumentParser,
    overrides: Iterable[str] = OVERRIDE_FLAGS,
    help: Mapping[str, str] | None = None,
) -> None:
    """Everything a command takes: the overrides (all by default), then the output options."""
    add_overrides(parser, overrides, help)
    add_output_options(parser)


def normalise_argv(
    argv: Sequence[str], inputs: tuple[str, ...] = (".toml",), stop: Callable[[str], bool] = lambda token: False
) -> list[str]:
    """``--json scenario.toml``: the scenario is an input, not the JSON file (which would overwrite it).

    ``--json`` takes an optional FILE, so argparse would swallow an input written right after it. ``--json``
    followed by a name ending in one of ``inputs`` becomes ``--json=-`` (the document to stdout) and the name
    stays a positional argument. Scanning ends at ``--`` or where ``stop`` says the command's own arguments
    end (capture: the script, or ``-m``).
    """
    out = list(argv)
    for i, token in enumerate(out):
        if token == "--" or stop(token):
            break
        if token == "--json" and i + 1 < len(out) and out[i + 1].endswith(inputs) and not out[i + 1].startswith("-"):
            out[i] = f"--json={STDOUT}"
    return out


def unwritable_folder(folder: Path) -> str | None:
    """Why a file cannot be made in ``folder`` (None: one can): tried, with a file made and removed at once.
    Why try: permissions do not tell (root passes every access check, and sysfs or a read-only mount still
    refuses), and a long run must not fail at its very end for a path it could have refused up front."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".simnccl-", suffix=".probe"):
            return None
    except OSError as err:
        return err.strerror or str(err)


def output_file_problem(target: str) -> str | None:
    """Why a file cannot be written at ``target`` (None: it can): a folder there, no folder for it, a folder that
    refuses a new file (tried: ``unwritable_folder``), a name the file system refuses. A symbolic link is
    followed, as writing it does: a link into a missing folder or a loop of links cannot be written either.
    Why all of it up front: a long run must not fail at its very end, and those failures were exit 70."""
    from pathlib import Path

    if not target:
        return "expected a file path, got ''"
    if target.endswith("/"):  # pathlib drops the slash, and the file would be written where a folder was named
        return f"{target!r} names a folder (it ends in '/'); expected a file to write"
    path = Path(target)
    try:
        real = path.resolve()  # the file a write through the link would make
        if real.is_dir():
            return f"{target!r} is a directory; expected a file to write"
        if not real.parent.is_dir():
            where = f" (the link's target {str(real)!r})" if path.is_symlink() else ""
            return f"no such directory {str(real.parent)!r} for {target!r}{where}"
        real.exists()  # a name the file system refuses (too long) raises here
    except RuntimeError as err:  # pathlib's own error for a loop of symbolic links
        return f"cannot follow {target!r}: {err}"
    except OSError as err:
        return f"cannot use {target!r}: {err.strerror or err}"
    problem = unwritable_folder(real.parent)
    if problem is not None:
        return f"cannot write in {str(real.parent)!r} for {target!r}: {problem}"
    return None


def check_json_target(target: str | None) -> None:
    """``--json FILE`` must be writable before anything runs (a long run must not fail at its very end)."""
    if target is None or target == STDOUT:
        return
    if target.endswith((".py", ".toml")):
        # an input's name where FILE goes (``--json train.py``): the document would overwrite the user's file
        raise OverrideError(
            "--json", f"{target!r} names a script or a scenario, not the JSON file; name a .json file for the document"
        )
    problem = output_file_problem(target)
    if problem is not None:
        raise OverrideError("--json", problem)


def check_fr_dir(target: str | None) -> None:
    """``--fr-dir DIR`` must be a folder, or a path where one can be made, before anything runs (it was an
    internal error, exit 70, when the dumps were written into a file or a device at the end of a variant)."""
    if not target:
        return
    from pathlib import Path

    path = Path(target)
    if path.exists() and not path.is_dir():
        raise OverrideError("--fr-dir", f"{target!r} exists and is not a folder; expected a folder for the dumps")
    parent = next((p for p in (path, *path.parents) if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise OverrideError("--fr-dir", f"{str(parent)!r} is not a folder, so {target!r} cannot be made")
    if parent is not None:  # a folder nobody may write in (read-only, no permission) failed only after the run
        problem = unwritable_folder(parent)
        if problem is not None:
            raise OverrideError("--fr-dir", f"cannot write in {str(parent)!r}: {problem}")


# ---------------------------------------------------------------------------------------------- overrides


def env_overrides(
    args: argparse.Namespace, extra_knobs: Sequence[str] | None = None, declare: str = ""
) -> dict[str, str]:
    """``--env`` as a dict, each name and value checked as a scenario's env table is (``env_knobs.env_problem``):
    a misspelt knob (``--env TORCH_DIST_USE_NCL2=0``) ran torch's default and exited 0. ``extra_knobs``: the
    scenario's ``[torch] extra_env_knobs``, which ``--env`` may set too (None: no scenario, so ``declare`` says
    how this command can be given a knob newer than simnccl's list)."""
    from simnccl.env_knobs import NO_SCENARIO_DECLARES, SCENARIO_DECLARES, env_problem

    if not declare:
        declare = NO_SCENARIO_DECLARES if extra_knobs is None else SCENARIO_DECLARES + " in the scenario file"
    pairs = getattr(args, "env", None) or []
    twice = repeated_env(pairs)
    if twice is not None:
        raise OverrideError("--env", twice)
    env = dict(pairs)
    for name, value in env.items():
        problem = env_problem(name, value, extra_knobs or (), declare)
        if problem is not None:
            raise OverrideError("--env", f"{name}: {problem}")
    return env


def repeated_env(pairs: Sequence[tuple[str, str]]) -> str | None:
    """Why ``--env`` pairs are refused, or None: one variable given two values (which one was meant is the user's
    to say, not the last one kept, as for every one-value flag); the same value twice says nothing new."""
    seen: dict[str, str] = {}
    for name, value in pairs:
        if seen.setdefault(name, value) != value:
            return f"{name} is given twice ({seen[name]!r} and {value!r}); give it once"
    return None


def checked_policies(specs: Sequence[str] | None) -> list[str]:
    """Each ``--policy`` spec, loaded once to check it (``simnccl.policy.get_policy`` decides what is valid)."""
    from simnccl.policy import PolicyError, get_policy

    out: list[str] = []
    for spec in specs or ():
        try:
            get_policy(spec)
        except PolicyError as err:
            raise OverrideError("--policy", str(err)) from None
        except (ImportError, AttributeError, TypeError, ValueError) as err:  # a user's import spec that breaks
            raise OverrideError("--policy", f"cannot load policy {spec!r}: {type(err).__name__}: {err}") from None
        if spec not in out:
            out.append(spec)
    return out


def checked_release(release: str | None) -> str | None:
    if release is not None and release not in RELEASES:
        raise OverrideError("--release", f"unknown torch release {release!r}; expected one of {', '.join(RELEASES)}")
    return release


def checked_gpu(gpu: str | None) -> Any:
    """The GpuKind ``--gpu`` names (None when not given)."""
    from simnccl.cluster import ClusterError, get_gpu_kind

    if gpu is None:
        return None
    try:
        return get_gpu_kind(gpu)
    except ClusterError as err:
        raise OverrideError("--gpu", str(err)) from None


def check_env(profile: Any, env: Mapping[str, str], flag: str = "--env") -> None:
    """The NCCL knobs the engine's memory model parses, checked as the scenario loader checks them."""
    from simnccl.profiles import ProfileError

    try:
        profile.check_env(env)
    except ProfileError as err:
        raise OverrideError(flag, str(err)) from None


def _policy_of(variant: Any, policy: str) -> str:
    """The policy ``--policy`` gives ``variant``: itself, or on a capture's steps (a variant whose policy is
    ``as-captured(...)``) the replay where it names the policy they were captured under
    (``simnccl.policy.as_captured.replayed_as``); any other is exit 2."""
    from simnccl.policy.as_captured import replayed_as

    try:
        return replayed_as(variant.policy, policy)
    except ValueError as err:
        raise OverrideError("--policy", f"variant {variant.name!r}: {err}") from None


def apply_overrides(scenario: Any, args: argparse.Namespace) -> Any:
    """The scenario with the command line's overrides applied (``--variant`` selects, the others replace).

    Order: ``--variant`` picks variants by their names in the file; ``--gpu`` and ``--release`` replace the
    cluster's GPU kind and each variant's release, and a variant's profile with the built-in one for the new
    pair when its own does not cover it; ``--env`` is added to every variant's environment; ``--policy``
    replaces every variant's policy (several: one variant per policy, expectations follow their variant);
    ``--seed`` replaces the seed and draws a generated fault swarm again.
    """
    from simnccl.cluster import Cluster
    from simnccl.faults import FaultError, FaultSchedule, check_program_faults_distinct, generate
    from simnccl.profiles import ProfileError, find_profile

    chosen = _selected(scenario, getattr(args, "variant", None))
    gpu = checked_gpu(getattr(args, "gpu", None))
    release = checked_release(getattr(args, "release", None))
    env = env_overrides(args, scenario.extra_knobs)
    policies = checked_policies(getattr(args, "policy", None))
    cluster = scenario.cluster
    if gpu is not None and gpu != cluster.gpu:
        cluster = Cluster(gpu, cluster.nodes, cluster.gpus_per_node, cluster.ranks_per_node)
    variants = []
    for variant in chosen:
        v_release = release or variant.release
        profile = variant.profile
        if profile.gpu != cluster.gpu.key or v_release not in profile.releases:
            try:
                profile = find_profile(cluster.gpu.key, v_release)
            except ProfileError as err:
                flag = {(True, False): "--gpu", (False, True): "--release"}.get(
                    (gpu is not None, release is not None), "--gpu/--release"
                )
                raise OverrideError(flag, str(err)) from None
        v_env = {**variant.env, **env}
        check_env(profile, v_env)
        variants.append(replace(variant, release=v_release, profile=profile, env=v_env))
    renamed: dict[str, list[str]] = {v.name: [v.name] for v in variants}
    if len(policies) == 1:
        variants = [replace(v, policy=_policy_of(v, policies[0])) for v in variants]
    elif policies:
        from simnccl.limits import current as current_limits
        from simnccl.limits import exceeded

        product = len(variants) * len(policies)  # checked before it is taken, as a [matrix]'s is
        if product > current_limits().max_variants:
            counted = f"{len(variants)} variant(s) x {len(policies)} policies = {product} variants"
            raise OverrideError("--policy", exceeded("max_variants", counted, current_limits().max_variants))
        renamed = {v.name: [f"{v.name},policy={p}" for p in policies] for v in variants}
        variants = [
            replace(v, name=f"{v.name},policy={p}", policy=_policy_of(v, p)) for v in variants for p in policies
        ]
    expectations = tuple(
        replace(e, variants=tuple(n for name in e.variants for n in renamed.get(name, ())))
        for e in scenario.expectations
    )
    seed, faults = scenario.seed, scenario.faults
    if getattr(args, "seed", None) is not None:
        seed = args.seed
        swarm = scenario.fault_swarm
        if swarm is not None:
            injected = faults.faults[: swarm.injected]
            try:
                drawn = generate(seed, scenario.programs, classes=swarm.classes, max_faults=swarm.max_faults)
                # as the file's own seed is checked (scenario.fault_table): a drawn fault beside an injected one
                # on the same rank reached the engine, an internal error (exit 70) for the same schedule
                check_program_faults_distinct((*injected, *drawn.faults))
            except FaultError as err:
                raise OverrideError("--seed", str(err)) from None
            faults = FaultSchedule(seed, drawn.classes, injected + drawn.faults)
    return replace(
        scenario,
        cluster=cluster,
        variants=tuple(variants),
        expectations=expectations,
        seed=seed,
        faults=faults,
    )


def _selected(scenario: Any, names: Sequence[str] | None) -> list[Any]:
    if not names:
        return list(scenario.variants)
    out = []
    for name in dict.fromkeys(names):  # once each, in the order given
        out.append(scenario.variant(name))  # ScenarioError naming --variant and the variants there are
    return out
