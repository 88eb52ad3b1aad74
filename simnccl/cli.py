"""``simnccl run|explain|cost|capture|real``: simulate scenarios, explain them, price startups, capture code, verify.

Every command takes the same overrides (``--policy``, ``--release``, ``--gpu``, ``--seed``, ``--env K=V``,
``--variant``) and output options (``--json [FILE]``, ``--quiet``, ``--version``): ``simnccl.cli_options``.
Exit codes are a contract for CI: 0 when every expectation holds, 1 when one doesn't, 2 on bad input
(an unreadable or invalid scenario, an unknown variant, a bad override) — never a traceback for bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simnccl.cli_guard import guarded
from simnccl.cli_options import (
    STDOUT,
    OutputError,
    OverrideError,
    UsageParser,
    add_common,
    add_version,
    check_fr_dir,
    check_json_target,
    normalise_argv,
)

DEFAULT_SCENARIO = "pytorch-199957.toml"
EXIT_OK, EXIT_EXPECTATIONS, EXIT_BAD_INPUT = 0, 1, 2


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def builtin_scenario_dir() -> Path:
    """The shipped scenarios: package data (``simnccl/scenarios``), so a wheel install has them too."""
    return Path(__file__).resolve().parent / "scenarios"


def _parser() -> argparse.ArgumentParser:
    from simnccl import cost
    from simnccl.nccl.command import add_validate_parser
    from simnccl.pictures import add_picture_arguments
    from simnccl.sweep import add_sweep_parser

    parser = UsageParser(prog="simnccl", description=__doc__.splitlines()[0])
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="simulate scenarios and check their expectations",
        description="Simulate scenarios (every variant, or --variant) and check their expectations. "
        "Exit 0: every expectation holds; 1: one does not; 2: bad input.",
    )
    run.add_argument("scenarios", nargs="*", help=f"scenario files (default: the built-in {DEFAULT_SCENARIO})")
    add_common(run)
    run.add_argument("--explain", action="store_true", help="print each policy decision and its reason")
    add_picture_arguments(run)
    _add_allow(run)
    run.add_argument(
        "--fr-dir",
        help="write each variant's flight-recorder dumps to FR_DIR/<scenario>-<variant>/rank_<r> (one folder per "
        "variant, the layout python -m torch.distributed.flight_recorder.fr_trace reads)",
    )
    explain = sub.add_parser(
        "explain",
        help="the hangs and failures of a run, in plain language",
        description="Simulate scenarios and tell, per variant, who waits for whom and why. Exit 0: every "
        "expectation holds (as for run); 1: one does not; 2: bad input.",
    )
    explain.add_argument("scenarios", nargs="*", help=f"scenario files (default: the built-in {DEFAULT_SCENARIO})")
    add_common(explain)
    _add_allow(explain)
    add_picture_arguments(explain, explain=True)
    cost_parser = sub.add_parser(
        "cost",
        help="per-rank startup cost of a framework config on torch's default, legacy and each policy",
        description="Framework knobs follow as --name value (e.g. --tp 8 --pp 4 --dp 16); see simnccl.cost.",
        allow_abbrev=False,
    )
    cost.add_arguments(cost_parser)
    add_validate_parser(sub)
    add_sweep_parser(sub)
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
        "see simnccl capture --help)",
    )
    return parser


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` under the top-level ``parser``."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (``run`` ... ``real diff``), without importing torch."""
    from simnccl.capture_cli import capture_parser
    from simnccl.real.__main__ import real_parsers

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {name: p for name, p in sub.choices.items() if name not in ("real", "capture")}
    parsers["capture"] = capture_parser()
    parsers.update({f"real {name}": p for name, p in real_parsers().items()})
    return parsers


def _add_allow(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow",
        type=_verdicts,
        default=frozenset(),
        help="verdicts other than pass that are not a failure when no [[expect]] asks for them (e.g. hang,error); "
        "race: a pass that a race of the simulated timing decided (real runs may fail) is not a failure either; "
        "unacted: nor a scheduled fault that never acted",
    )


def _verdicts(text: str) -> frozenset[str]:
    from simnccl.expect import ACCEPTABLE

    chosen = frozenset(v.strip() for v in text.split(",") if v.strip())
    if not chosen:  # "--allow ''" from an unset shell variable allowed nothing, silently
        raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(ACCEPTABLE)}, comma-separated")
    unknown = sorted(chosen - set(ACCEPTABLE))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown verdict(s) {', '.join(unknown)}; expected {', '.join(ACCEPTABLE)}")
    return chosen


@guarded
def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["capture"]:
        from simnccl.capture_cli import main as capture_main

        return capture_main(raw[1:])  # parses (and answers --help) before torch is imported
    if raw[:1] == ["real"]:
        from simnccl.real.__main__ import main as real_main

        return real_main(raw[1:])
    parser = _parser()
    args, extra = parser.parse_known_args(normalise_argv(raw))
    from simnccl.cli_output import document_owns_stdout

    json_target = getattr(args, "json", None)
    to_stdout = (STDOUT in (json_target, getattr(args, "csv", None)) and not getattr(args, "dry_run", False)) or (
        args.command == "sweep" and isinstance(json_target, str) and json_target.endswith(".toml")  # its matrix
    )
    with document_owns_stdout(to_stdout):
        return _command(parser, args, extra)


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    if args.command == "cost":
        from simnccl import cost

        return cost.run(args, extra)  # the framework knobs are the workload generator's to parse
    if args.command == "validate" and not extra:
        from simnccl.nccl.command import run_validate

        return run_validate(args)
    if extra:  # the command's parser says it: `simnccl run: error: ...`, pointing at `simnccl run --help`
        command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "sweep":
        from simnccl.sweep import run_sweep

        return run_sweep(args)
    return run_scenarios(args)


def run_scenarios(args: argparse.Namespace) -> int:
    """``run`` and ``explain``: each scenario's variants, streamed as they finish, then the summary."""
    from simnccl.cli_options import apply_overrides
    from simnccl.cli_output import Output
    from simnccl.engine import EngineGuardError
    from simnccl.explain import explain as explain_variant
    from simnccl.flight_recorder import write_dumps
    from simnccl.pictures import PictureError, check_pictures, needs_trace, write_pictures
    from simnccl.report import print_footer, print_header, print_variant, variant_summary
    from simnccl.result import VariantResult
    from simnccl.runner import run_scenario
    from simnccl.scenario import ScenarioError, load_scenario

    out = Output(args.command, args)
    paths = [Path(p) for p in args.scenarios] or [builtin_scenario_dir() / DEFAULT_SCENARIO]
    try:
        check_json_target(args.json)
        check_pictures(args)
        check_fr_dir(getattr(args, "fr_dir", None))
        scenarios = [apply_overrides(load_scenario(p), args) for p in paths]
    except (ScenarioError, OverrideError, PictureError) as error:
        out.error(str(error))
        return EXIT_BAD_INPUT
    explaining = args.command == "explain"
    records: list[dict[str, Any]] = []
    results = []
    ok = True
    finished_names: dict[int, set[str]] = {}  # id(scenario) -> its variants that finished
    try:
        with out.progress(sum(len(s.variants) for s in scenarios), "variants") as bar:
            for scenario in scenarios:
                if scenario.faults.faults or scenario.faults.seed is not None:
                    # The schedule is the run's identity: print it before anything runs (testing-practices §1).
                    out.note(f"{scenario.name}: {scenario.faults.describe()}", always=True)
                # --variant left these expectations without a variant to check them on: say so, or "all
                # expectations hold" read as if they had held (found by a tester)
                unchecked = [f"expect[{i}]" for i, e in enumerate(scenario.expectations) if not e.variants]
                if unchecked:
                    out.note(
                        f"{scenario.name}: {', '.join(unchecked)} not checked: --variant left out every variant "
                        "it names",
                        always=True,
                    )
                out.show(lambda console, s=scenario: print_header(console, s.name, s.source, s.seed))

                def finished(variant: VariantResult, scenario_name: str = scenario.name, this: Any = scenario) -> None:
                    bar.advance(f"{scenario_name}: {variant.name}")
                    if explaining:
                        out.print(explain_variant(variant))
                    else:
                        out.show(lambda console: print_variant(console, variant, explain=args.explain))
                        if args.fr_dir and variant.outcome.fr_dumps:
                            folder = Path(args.fr_dir) / _safe(f"{scenario_name}-{variant.name}")
                            try:
                                write_dumps(variant.outcome.fr_dumps, folder)
                            except OSError as err:  # checked up front; a disk that fills or a folder removed since
                                raise OutputError(f"--fr-dir: cannot write {str(folder)!r}: {err.strerror}") from None
                            out.note(f"flight-recorder dumps: {folder}")
                    out.add(variant_summary(scenario_name, variant))
                    finished_names.setdefault(id(this), set()).add(variant.name)

                try:
                    result = run_scenario(
                        scenario,
                        on_variant=finished,
                        keep_trace=needs_trace(args),
                        allow=getattr(args, "allow", frozenset()),
                    )
                except EngineGuardError as error:
                    out.error(stopped_at_a_limit(error, scenario.source))
                    return EXIT_BAD_INPUT
                if not explaining:
                    out.show(lambda console, r=result: print_footer(console, r))
                records.append(_explained(result, explain_variant) if explaining else result.to_dict())
                results.append(result)
                ok = ok and result.ok
    except KeyboardInterrupt:
        # What finished, in the document too (--json FILE was not written, --json - left stdout empty): each
        # variant not finished is a summary line that is not ok, so the document never reads as passing.
        if out.json_target is not None:
            for scenario in scenarios:
                done = finished_names.get(id(scenario), set())
                missing = [v.name for v in scenario.variants if v.name not in done]
                if missing:
                    out.not_finished(scenario.name, missing)
            out.finish(records, show_summary=False)
        raise  # simnccl.cli_guard: exit 130 and the journal's lines
    try:
        write_pictures(args, results, out.err)
    except PictureError as error:  # user paths and "simnccl[plots]": printed literally, never as markup
        out.error(str(error))
        return EXIT_BAD_INPUT
    out.finish(records)
    return EXIT_OK if ok else EXIT_EXPECTATIONS


def stopped_at_a_limit(error: Exception, source: str) -> str:
    """The one line for a run the engine's guard stopped (``EngineGuardError``): where, and the input limit
    to raise. Why exit 2: a run stopped at a size limit (wall seconds, simulated seconds, engine work) checked
    nothing, and the limit is a property of the input's size, as ``max_wall_s`` is for the whole command
    (``simnccl.cli_guard``); 1 would say an expectation failed, which nobody checked."""
    from simnccl.runner import limit_hint

    notes = [n.removeprefix("while simulating ") for n in getattr(error, "__notes__", ())]
    where = notes[0].replace(", variant ", " (variant ", 1) + ")" if notes else source
    return f"{where}: simulation stopped: {error} ({limit_hint(error)})"


def _explained(result: Any, explain_variant: Any) -> dict[str, Any]:
    """``explain --json``: per variant its verdict, the explanation text and the facts it is drawn from."""
    return {
        "scenario": result.scenario,
        "source": result.source,
        "seed": result.seed,
        "ok": result.ok,
        "variants": [
            {
                "name": v.name,
                "verdict": v.verdict,
                "ok": v.ok,
                "explanation": explain_variant(v),
                "hangs": v.outcome.hangs,
                "errors": v.outcome.errors,
                "slowdowns": v.outcome.slowdowns,
            }
            for v in result.variants
        ],
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
