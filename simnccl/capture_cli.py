"""``simnccl capture`` (also ``python -m simnccl.capture``): the command line of ``simnccl.capture``.

Why a module of its own: ``simnccl.capture`` imports torch (seconds, and a NumPy warning without NumPy), and
``simnccl capture --help``, ``--version`` or a bad flag must answer without it. This module parses the
arguments with the options every simnccl command shares (``simnccl.cli_options``), checks them, and only
then imports the capture machinery. ``--simulate`` replays the captured Programs as the scenario ``--toml``
would write, through the same runner and report as ``simnccl run``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simnccl.cli_options import (
    STDOUT,
    OutputError,
    OverrideError,
    UsageParser,
    add_common,
    check_json_target,
    checked_gpu,
    checked_policies,
    checked_release,
    env_overrides,
    normalise_argv,
    output_file_problem,
    seconds,
)
from simnccl.visible_text import invisible_in, visible

DEFAULT_TIMEOUT_S = 120.0
MODES = ("fork", "inline")


def world_problem(world_size: int) -> str | None:
    """Why a capture may not run ``world_size`` ranks (None: it may). A capture runs every rank (one forked
    process each, ~0.2 CPU s a Megatron rank), so the world is bounded by ``max_world_size`` before anything
    is made for it: ``--world 100000000`` is bad input, not hours of forking (nor a list of 10^8 pending
    ranks)."""
    from simnccl.limits import current, exceeded

    limit = current().max_world_size
    if world_size > limit:
        return exceeded("max_world_size", f"a world of {world_size} ranks", limit)
    return None


DEFAULT_GPU, DEFAULT_RELEASE = "h100-80gb", "2.15"
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def capture_parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog="simnccl capture",
        description="Run unmodified torch.distributed code once per simulated rank and record its Programs "
        "(needs torch). Exit 0: captured (and, with --simulate, every variant passed); 1: a simulated variant "
        "did not pass; 2: bad input, or the captured code failed.",
    )
    parser.add_argument("--world", type=int, required=True, help="world size (number of simulated ranks)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: min(world, 8))")
    parser.add_argument("--mode", choices=MODES, default=None, help="fork (default on Linux) or inline")
    parser.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT_S, help="seconds per rank")
    parser.add_argument("--jobs", type=int, default=None, help="ranks run at a time in fork mode (default: CPUs)")
    parser.add_argument("--simulate", action="store_true", help="replay the Programs in the simulator")
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="every rank imports the script's modules itself (default: its leading imports are imported once, "
        "in a fork server, and every rank forks from it; see simnccl.capture.script)",
    )
    parser.add_argument("--toml", metavar="PATH", help="write a scenario file with the captured Programs")
    parser.add_argument("--name", default="captured", help="scenario name for --toml and --simulate")
    parser.add_argument(
        "--step",
        metavar="MODULE:FUNCTION",
        help="the first training step, run after the code (startup) on each rank and called with its module "
        "globals (a dict: the model, optimizer... the script left): its tensors and collectives are recorded "
        "between checkpoints 'startup' and 'step1' (MODULE may be a FILE.py)",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module as __main__ (like python -m)")
    parser.add_argument("script", nargs="?", help="a script to run (when -m is not given)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the module or script")
    add_common(
        parser,
        help={
            "--policy": "policy the captured ranks run under (simnccl.torch_apply.apply) and --simulate uses; "
            "repeated: capture without one, one simulated variant each, refused (exit 2) where it would change "
            "the captured branches",
            "--release": f"torch release to emulate (default {DEFAULT_RELEASE})",
            "--gpu": f"GPU kind for --simulate and --toml (default {DEFAULT_GPU})",
            "--seed": "seed of the --simulate run",
            "--env": "environment of the captured code, and of --simulate and --toml (repeatable)",
            "--variant": "with --simulate: only this simulated variant (default; default,policy=SPEC with several "
            "--policy)",
        },
    )
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Everything after ``-m MODULE`` (or after the script) belongs to the captured code, as with python -m."""
    parser = capture_parser()
    raw = normalise_argv(argv, (".toml", ".py"), stop=lambda token: token == "-m" or token.endswith(".py"))
    if "-m" in raw and not _script_before(parser, raw, raw.index("-m")):
        at = raw.index("-m")
        head, module, rest = raw[:at], raw[at + 1 : at + 2], raw[at + 2 :]
        args = parser.parse_args([*head, "-m", *module])
        args.args = rest
    else:
        args = parser.parse_args(raw)
    if args.module is None and args.script is None:
        parser.error("expected -m MODULE or a script path")
    if args.module is not None and args.script is not None:
        args.args = [args.script, *args.args]
    return args


def _script_before(parser: argparse.ArgumentParser, raw: Sequence[str], at: int) -> bool:
    """Whether a script path comes before ``raw[at]`` (a ``-m``): then that ``-m`` is one of the script's own
    arguments (``train.py -m llama``), not ours. Options and their values are skipped as the parser reads them.
    Why: ``-m`` was looked for anywhere, and a script's ``-m llama`` was taken away from it without a word."""
    actions = parser._option_string_actions
    i = 0
    while i < at:
        token = raw[i]
        if not token.startswith("-") or token == "-":
            return True
        action = actions.get(token.split("=", 1)[0])
        i += 1
        if action is None or "=" in token or i >= at:
            continue
        if action.nargs is None or (action.nargs == "?" and not raw[i].startswith("-")):  # its value: skipped
            i += 1
    return False


def check_toml_target(args: argparse.Namespace) -> None:
    """``--toml PATH`` must be a file the run can write, and not the script it captures or the --json file (the
    scenario was written over the user's script: exit 0, the script gone)."""
    if args.toml is None:
        return
    problem = output_file_problem(args.toml) if args.toml else "expected a file to write the scenario to, got ''"
    if problem is not None:
        raise OverrideError("--toml", problem)
    target = Path(args.toml).resolve()
    for flag, other in (("the captured script", args.script), ("--json", args.json)):
        if other and other != "-" and Path(other).resolve() == target:
            raise OverrideError("--toml", f"{args.toml!r} is {flag}; give another file for the scenario")


def main(argv: Sequence[str] | None = None) -> int:
    from simnccl.cli_output import document_owns_stdout

    args = parse(list(sys.argv[1:] if argv is None else argv))
    # ``--json -``: the document alone on stdout, whatever a policy or the captured code prints (as every command)
    with document_owns_stdout(args.json == STDOUT):
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    from simnccl.cli_output import Output
    from simnccl.prerequisites import MissingPrerequisite, require_torch

    out = Output("capture", args)
    try:
        require_torch("simnccl capture")
        check_json_target(args.json)
        check_toml_target(args)
        bad = invisible_in(args.name)  # the scenario's name: a file with one is refused by `simnccl run`
        if not args.name.strip() or bad is not None:
            wanted = "a name on one line without control characters"
            raise OverrideError("--name", f"expected {wanted}, got '{visible(args.name)}'")
        release = checked_release(args.release) or DEFAULT_RELEASE
        gpu = args.gpu or DEFAULT_GPU
        checked_gpu(gpu)
        checked_policies(args.policy)
        too_large = world_problem(args.world)  # before torch is imported: a bad world is answered at once
        if too_large is not None:
            raise OverrideError("--world", too_large)
    except (MissingPrerequisite, OverrideError) as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    import importlib.util

    from simnccl.capture import CaptureError, capture, script_target

    try:
        path = None if args.module else args.script
        target = script_target(args.module, path, args.args, preload=not args.no_preload)
        if args.module is not None:
            try:  # a relative name (``.foo``) raises rather than answering None
                with target.importing():  # found where ``python -m`` finds it: the working directory first
                    found = importlib.util.find_spec(args.module)
            except (ImportError, ValueError) as err:
                raise CaptureError(f"-m {args.module!r}: {err} (expected an importable module)") from None
            if found is None:
                raise CaptureError(f"no module named {args.module!r} (expected an importable module for -m)")
        elif not Path(args.script).is_file():
            raise CaptureError(f"no such script {args.script!r} (expected a Python file, or -m MODULE)")
        step = None if args.step is None else step_function(args.step, args.module, args.script)
        run = capture(
            target,
            args.world,
            step=step,
            gpu=gpu,
            gpus_per_node=args.gpus_per_node,
            release=release,
            env=env_overrides(
                args, declare="set a newer one in the environment simnccl capture runs in, which every rank inherits"
            ),
            mode=args.mode,
            timeout_s=args.timeout,
            jobs=args.jobs,
            policy=args.policy[0] if args.policy and len(args.policy) == 1 else None,
        )
    except (CaptureError, ModuleNotFoundError, ValueError) as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    out.print(run.summary())
    record: dict[str, Any] = {"capture": run.to_json(), "simulated": None}
    try:
        if args.toml:
            try:
                Path(args.toml).write_text(run.to_scenario_toml(args.name, gpu=gpu), encoding="utf-8")
            except OSError as err:
                raise OutputError(f"--toml: cannot write {args.toml!r}: {err.strerror or err}") from None
            out.note(f"wrote {args.toml}")
        if args.simulate:
            simulated = _simulate(run, args, gpu, out)
            if simulated is None:
                return EXIT_BAD_INPUT
            record["simulated"] = simulated.to_dict()
        else:
            distinct = len({id(p) for p in run.programs})
            out.add(_captured_line(args.name, run.world_size, distinct))
    except CaptureError as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    return EXIT_OK if out.finish([record]) else EXIT_FAILED


def step_function(spec: str, module: str | None, script: str | None) -> Any:
    """The step ``--step MODULE:FUNCTION`` (or ``FILE.py:FUNCTION``) names, looked up in each rank.

    Nothing of it runs here: the captured script (or ``-m`` module) is its own startup, so a step it defines is
    taken from the globals its run left in the rank; another module or file is imported in the rank, after
    startup. Only the spelling and the file's or module's existence are checked before the capture.
    """
    import importlib.util
    import runpy

    from simnccl.capture import CaptureError

    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise CaptureError(f"--step: expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise CaptureError(f"--step: no such file {where!r} (expected FILE.py:FUNCTION)")
        own = script is not None and Path(where).resolve() == Path(script).resolve()
    else:
        try:
            found = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise CaptureError(f"--step: cannot import {where!r} (expected MODULE:FUNCTION)")
        own = where == module

    def step(state: Any) -> Any:
        if own:
            namespace = state
        elif where.endswith(".py"):
            namespace = runpy.run_path(where, run_name="__simnccl_step__")
        else:
            namespace = vars(importlib.import_module(where))
        function = namespace.get(name) if isinstance(namespace, dict) else None
        if not callable(function):
            raise CaptureError(f"--step: {where!r} has no function {name!r}")
        return function(state)

    return step


def _captured_line(name: str, world: int, distinct: int) -> Any:
    from simnccl.result import SummaryLine

    return SummaryLine(name, "capture", "captured", True, f"{world} ranks, {distinct} distinct program(s)")


def _simulate(run: Any, args: argparse.Namespace, gpu: str, out: Any) -> Any:
    """The captured Programs as the scenario ``--toml`` writes, with --policy/--seed/--variant applied."""
    import tomllib

    from simnccl.capture import CaptureError
    from simnccl.cli_options import apply_overrides
    from simnccl.report import print_variant, variant_summary
    from simnccl.runner import run_scenario
    from simnccl.scenario import ScenarioError, parse_scenario

    try:
        scenario = parse_scenario(tomllib.loads(run.to_scenario_toml(args.name, gpu=gpu)), f"<captured {args.name}>")
        # Captured under one policy: the file replays its decisions (``as-captured``); naming it again would ask
        # the policy about its own output (``CapturedRun.replay_policy``)
        policies = None if run.policy is not None else args.policy
        only = argparse.Namespace(policy=policies, seed=args.seed, variant=args.variant)
        scenario = apply_overrides(scenario, only)
    except (ScenarioError, OverrideError) as err:
        out.error(str(err))
        return None
    for variant in scenario.variants:  # a branch the code did not take is no honest answer: refuse it
        try:
            run.check_replay(release=variant.release, env=variant.env, policy=variant.policy)
        except CaptureError as err:
            out.error(f"variant {variant.name!r}: {err}")
            return None
    with out.progress(len(scenario.variants), "simulating") as bar:

        def finished(variant: Any) -> None:
            bar.advance(variant.name)
            out.show(lambda console: print_variant(console, variant))
            out.add(variant_summary(scenario.name, variant))

        return run_scenario(scenario, on_variant=finished)
