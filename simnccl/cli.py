"""``simnccl run [SCENARIO ...] [--variant NAME] [--json]``.

Exit codes are a contract for CI: 0 when every expectation holds, 1 when one doesn't, 2 on bad input
(an unreadable or invalid scenario, an unknown variant) — never a traceback for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from simnccl.engine import EngineGuardError
from simnccl.report import print_result
from simnccl.runner import run_scenario
from simnccl.scenario import ScenarioError, load_scenario

DEFAULT_SCENARIO = "pytorch-199957.toml"
EXIT_OK, EXIT_EXPECTATIONS, EXIT_BAD_INPUT = 0, 1, 2


def builtin_scenario_dir() -> Path:
    """The repository's ``scenarios/`` folder (simnccl is installed editable from its checkout)."""
    return Path(__file__).resolve().parent.parent / "scenarios"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simnccl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate scenarios and check their expectations")
    run.add_argument("scenarios", nargs="*", help=f"scenario files (default: the built-in {DEFAULT_SCENARIO})")
    run.add_argument("--variant", action="append", help="run only this variant (repeatable)")
    run.add_argument("--json", action="store_true", help="print the result as JSON (schema in README)")
    run.add_argument("--explain", action="store_true", help="print each policy decision and its reason")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
            results.append(run_scenario(scenario, args.variant))
    except ScenarioError as error:
        err.print(f"[red]error:[/red] {error}", highlight=False)
        return EXIT_BAD_INPUT
    except EngineGuardError as error:
        err.print(f"[red]simulation stopped:[/red] {error}", highlight=False)
        return EXIT_EXPECTATIONS
    if args.json:
        payload = [r.to_dict() for r in results]
        sys.stdout.write(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2, default=str) + "\n")
    else:
        for result in results:
            print_result(result, console, explain=args.explain)
    return EXIT_OK if all(r.ok for r in results) else EXIT_EXPECTATIONS


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
