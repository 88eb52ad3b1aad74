"""``simnccl run [SCENARIO ...] [--variant NAME] [--json]`` and ``simnccl cost --workload NAME [knobs]``.

Exit codes are a contract for CI: 0 when every expectation holds, 1 when one doesn't, 2 on bad input
(an unreadable or invalid scenario, an unknown variant) — never a traceback for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from simnccl import cost
from simnccl.cli_guard import guarded
from simnccl.engine import EngineGuardError
from simnccl.explain import explain as explain_variant
from simnccl.flight_recorder import write_dumps
from simnccl.prerequisites import MissingPrerequisite, require_torch
from simnccl.report import print_result
from simnccl.runner import run_scenario
from simnccl.scenario import VERDICTS, ScenarioError, load_scenario

DEFAULT_SCENARIO = "pytorch-199957.toml"
EXIT_OK, EXIT_EXPECTATIONS, EXIT_BAD_INPUT = 0, 1, 2


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def builtin_scenario_dir() -> Path:
    """The shipped scenarios: package data (``simnccl/scenarios``), so a wheel install has them too."""
    return Path(__file__).resolve().parent / "scenarios"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simnccl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate scenarios and check their expectations")
    run.add_argument("scenarios", nargs="*", help=f"scenario files (default: the built-in {DEFAULT_SCENARIO})")
    run.add_argument("--variant", action="append", help="run only this variant (repeatable)")
    run.add_argument("--json", action="store_true", help="print the result as JSON (schema in README)")
    run.add_argument("--explain", action="store_true", help="print each policy decision and its reason")
    run.add_argument("--fr-dir", help="write each variant's flight-recorder dumps to FR_DIR/<variant>/rank_<r>")
    run.add_argument(
        "--allow",
        type=_verdicts,
        default=frozenset(),
        help="verdicts other than pass that are not a failure when no [[expect]] asks for them (e.g. hang,error)",
    )
    explain = sub.add_parser("explain", help="the hangs and failures of a run, in plain language")
    explain.add_argument("scenarios", nargs="*", help=f"scenario files (default: the built-in {DEFAULT_SCENARIO})")
    explain.add_argument("--variant", action="append", help="only this variant (repeatable)")
    cost_parser = sub.add_parser(
        "cost",
        help="per-rank startup cost of a framework config on torch's default, legacy and each policy",
        description="Framework knobs follow as --name value (e.g. --tp 8 --pp 4 --dp 16); see simnccl.cost.",
        allow_abbrev=False,
    )
    cost.add_arguments(cost_parser)
    sub.add_parser(
        "real",
        add_help=False,
        help="the verification tier: run, compare, diff, calibrate on real torch.distributed (imports torch; "
        "see simnccl real --help)",
    )
    sub.add_parser(
        "capture",
        add_help=False,
        help="run unmodified torch code per simulated rank and record its Programs (imports torch; "
        "see python -m simnccl.capture --help)",
    )
    return parser


def _verdicts(text: str) -> frozenset[str]:
    chosen = frozenset(v.strip() for v in text.split(",") if v.strip())
    unknown = sorted(chosen - set(VERDICTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown verdict(s) {', '.join(unknown)}; expected {', '.join(VERDICTS)}")
    return chosen


@guarded
def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] in (["capture"], ["real"]):
        # Both import torch: only here, never on the import path of ``simnccl`` or this module.
        try:
            require_torch(f"simnccl {raw[0]}")
        except MissingPrerequisite as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if raw[0] == "capture":
            from simnccl.capture import main as capture_main

            return capture_main(raw[1:])
        from simnccl.real.__main__ import main as real_main

        return real_main(raw[1:])
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "cost":
        return cost.run(args, extra)  # the framework knobs are the workload generator's to parse
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    paths = [Path(p) for p in args.scenarios] or [builtin_scenario_dir() / DEFAULT_SCENARIO]
    # Tables are wider than 80 columns; when output is captured (CI logs) don't wrap them.
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    results = []
    try:
        scenarios = [load_scenario(p) for p in paths]
        for scenario in scenarios:
            if args.variant:
                for name in args.variant:
                    scenario.variant(name)
        for scenario in scenarios:
            if scenario.faults.faults or scenario.faults.seed is not None:
                # The schedule is the run's identity: print it before anything runs (testing-practices §1).
                err.print(f"{scenario.name}: {scenario.faults.describe()}", highlight=False, markup=False)
            results.append(run_scenario(scenario, args.variant, allow=getattr(args, "allow", frozenset())))
    except ScenarioError as error:
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return EXIT_BAD_INPUT
    except EngineGuardError as error:
        err.print(f"[red]simulation stopped:[/red] {escape(str(error))}", highlight=False)
        return EXIT_EXPECTATIONS
    if args.command == "explain":
        for result in results:
            for variant in result.variants:
                console.print(explain_variant(variant), highlight=False, markup=False)
        return EXIT_OK
    if args.fr_dir:
        for result in results:
            for variant in result.variants:
                if variant.outcome.fr_dumps:
                    folder = Path(args.fr_dir) / _safe(f"{result.scenario}-{variant.name}")
                    write_dumps(variant.outcome.fr_dumps, folder)
                    err.print(f"flight-recorder dumps: {folder}", highlight=False, markup=False)
    if args.json:
        payload = [r.to_dict() for r in results]
        sys.stdout.write(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2, default=str) + "\n")
    else:
        for result in results:
            print_result(result, console, explain=args.explain)
    return EXIT_OK if all(r.ok for r in results) else EXIT_EXPECTATIONS


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
