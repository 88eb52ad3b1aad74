"""``simnccl real run|compare|diff|calibrate|gpu-scenarios`` (also ``python -m simnccl.real ...``): the verification
tier's command line.

``run`` and ``compare`` take every override of ``simnccl run`` (``--policy``, ``--release``, ``--gpu``, ``--seed``,
``--env``, ``--variant``), ``diff`` takes ``--seed``; all three take ``--json [FILE]`` (one document, the shape
every simnccl command writes) and ``--quiet``, and print each variant (diff: each case) as it finishes.
Exit codes: 0 pass / agreement; 1 a run that did not pass, or a disagreement; 2 bad input (a user's policy that
raised, on the real ranks too, as ``simnccl run`` says) or a lane that cannot run here (no CUDA device for the GPU
lane, more ranks than GPUs, torch not installed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from simnccl.cli_options import (
    OverrideError,
    UsageParser,
    add_common,
    add_version,
    apply_overrides,
    check_json_target,
    factor,
    seconds,
)
from simnccl.interrupt_deferral import deferred_interrupt
from simnccl.real.lanes import LANES, LaneError
from simnccl.real.launch import RunSettings, check_local_world
from simnccl.result import SummaryLine
from simnccl.scenario import ScenarioError, load_scenario

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _settings(args: argparse.Namespace) -> RunSettings:
    return RunSettings.for_lane(
        args.lane,
        timeout_s=args.timeout,
        torch_timeout_s=args.torch_timeout,
        stall_s=args.stall,
        compute_scale=args.compute_scale,
        keep_dir=args.keep or None,
    )


def _lane_defaults(field: str, unit: str = " s") -> str:
    """ "cpu 5 s, gpu 120 s": read from RunSettings, so the help cannot disagree with the code."""
    values = []
    for lane in LANES:
        value = getattr(RunSettings.for_lane(lane), field)
        values.append(f"{lane} {'none' if value is None else f'{value:g}{unit}'}")
    return ", ".join(values)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario TOML file")
    parser.add_argument("--lane", choices=LANES, default="cpu", help="cpu: gloo substituted (default); gpu: NCCL")
    parser.add_argument(
        "--timeout", type=seconds, help=f"wall-clock limit of one run in seconds ({_lane_defaults('timeout_s')})"
    )
    parser.add_argument(
        "--torch-timeout",
        type=seconds,
        help=f"timeout passed to group creation ({_lane_defaults('torch_timeout_s')}; on the cpu lane hangs are "
        "found by --stall)",
    )
    parser.add_argument(
        "--stall", type=seconds, help=f"no progress for this long is a hang ({_lane_defaults('stall_s')})"
    )
    parser.add_argument(
        "--compute-scale",
        type=factor,
        help=f"compute ops sleep seconds x this ({_lane_defaults('compute_scale', '')})",
    )
    parser.add_argument("--keep", action="store_true", help="keep the per-rank progress files and logs")
    add_common(parser)


def _parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="simnccl real", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario on real torch.distributed (spawned locally, or under torchrun)")
    _common(run)
    compare = sub.add_parser("compare", help="run the simulator and real torch on a scenario, side by side")
    _common(compare)
    compare.add_argument("--tolerance-pct", type=factor, default=10.0, help="GPU lane: allowed memory error (%%)")
    diff = sub.add_parser("diff", help="differential test: generated programs on real gloo and in the simulator")
    diff.add_argument("--count", type=int, default=50, help="number of generated cases (2-4 ranks, <= 12 ops)")
    diff.add_argument("--only", type=int, action="append", help="run only case INDEX of the seed (repeatable)")
    diff.add_argument("--parallel", type=int, default=3, help="worlds run at once (hung ranks mostly sleep)")
    diff.add_argument("--verbose", action="store_true", help="print every case in full, not only disagreements")
    diff.add_argument(
        "--stall",
        type=seconds,
        help="no progress for this long is a hang on the real side (default 5 s; raise it on a loaded machine)",
    )
    diff.add_argument("--timeout", type=seconds, help="wall-clock limit of one case's real run in seconds (default 30)")
    add_common(diff, ("--seed",), help={"--seed": "seed of the generated cases (default 0)"})
    calibrate = sub.add_parser("calibrate", help="GPU lane: measure a profile (needs CUDA)")
    calibrate.add_argument("--out", required=True, help="profile TOML to write, e.g. simnccl/profiles/NAME.toml")
    calibrate.add_argument("--gpu-kind", help="simnccl GPU kind key (default: guessed from the device name)")
    calibrate.add_argument("--timeout", type=seconds, default=420.0, help="wall-clock limit of the suite in seconds")
    calibrate.add_argument("--json", metavar="FILE", help="also write the raw measurements as JSON")
    add_version(calibrate)
    scen = sub.add_parser("gpu-scenarios", help="write the GPU check scenarios for this machine (gpu_check.sh)")
    scen.add_argument("--out", required=True, help="folder to write them to")
    scen.add_argument("--profile", required=True, help="the profile they are priced by (e.g. the calibrated one)")
    scen.add_argument("--gpu-kind", help="simnccl GPU kind key (default: the profile's)")
    scen.add_argument("--ranks", type=int, help="ranks per world (default: visible GPUs, at most 2)")
    add_version(scen)
    return parser


def real_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser by name (for the flag-parity tests and the docs)."""
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def main(argv: Sequence[str] | None = None) -> int:
    from simnccl.cli_options import STDOUT, normalise_argv
    from simnccl.cli_output import document_owns_stdout

    args = _parser().parse_args(normalise_argv(list(sys.argv[1:] if argv is None else argv)))
    # ``--json -``: the document alone on stdout, whatever a policy or a rank process prints (as every command)
    with document_owns_stdout(args.command in ("run", "compare", "diff") and args.json == STDOUT):
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    from simnccl.cli_output import Output
    from simnccl.prerequisites import MissingPrerequisite, require_torch

    out = Output(f"real {args.command}", args)
    try:
        require_torch("simnccl real")
    except MissingPrerequisite as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    if args.command == "gpu-scenarios":
        return _gpu_scenarios(args)
    if args.command == "calibrate":
        from simnccl.real.calibrate import main as calibrate_main

        return calibrate_main(args)
    try:
        check_json_target(args.json)
        if args.command == "diff":
            return _diff(args, out)
        scenario = apply_overrides(load_scenario(args.scenario), args)
        if scenario.recovery is not None:
            # The memberships of a recovery run are re-formed by simnccl.recovery between segments; the real
            # lanes run the workload's steps as written, where its groups were never created (every rank then
            # ended in an error and the run "failed", exit 1, for a reason that is not the scenario's).
            raise ScenarioError(
                scenario.source,
                "recovery",
                "a [recovery] scenario is simulated only (simnccl.recovery re-forms its process groups between "
                "segments); the real tier cannot run it: use `simnccl run`",
            )
        settings = _settings(args)
        from simnccl.real.torchrun_mode import under_torchrun

        if args.command == "compare" or not under_torchrun():  # (torchrun's world spans machines: its own check)
            check_local_world(len(scenario.programs), settings)  # before the simulated side of a comparison runs
        if args.command == "run":
            return _run(scenario, settings, args, out)
        return _compare(scenario, settings, args, out)
    except (ScenarioError, OverrideError, LaneError, MissingPrerequisite) as err:
        out.error(str(err), prefix="real: ")
        return EXIT_BAD_INPUT


def _merged(reports: list[dict[str, Any]], ok: bool) -> dict[str, Any]:
    """Per-variant reports (each variant ran as it own report, to stream it) as one report."""
    merged = dict(reports[0]) if reports else {}
    merged["variants"] = [v for r in reports for v in r["variants"]]
    merged["ok"] = ok
    return merged


def _journal_running(scenario: Any, variant: str) -> None:
    """Tell the command's journal (``simnccl.cli_guard``) which variant runs now: an error or a Ctrl-C names it."""
    from simnccl.runner import current_journal

    journal = current_journal()
    if journal is not None:
        journal.running = (scenario.source, variant)


def _journal_finished(scenario: Any, variant: str, outcome: str) -> None:
    """Tell the journal a variant finished: the report of an interrupted command lists it (it said "nothing had
    finished", the real tier's variants being no simulator results)."""
    from simnccl.runner import current_journal

    journal = current_journal()
    if journal is not None:
        journal.lines.append(f"finished  {scenario.source}  {variant}: {outcome}")
        journal.running = None


def _finish_interrupted(out: Any, scenario: Any, lane: str, reports: list[dict[str, Any]]) -> None:
    """Ctrl-C: the summary and the JSON document of what finished, marked ``interrupted`` (with the variants that
    did not finish, each also a summary line that is not ok: an interrupted run never reads as passing), and the
    journal's lines for the variant that was running and those never started. Why: the real tier wrote no JSON
    and said "nothing had finished" after variants had run for minutes."""
    from simnccl.runner import current_journal

    finished = {v["name"] for report in reports for v in report["variants"]}
    not_finished = [v.name for v in scenario.variants if v.name not in finished]
    journal = current_journal()
    if journal is not None:
        for index, name in enumerate(not_finished):
            journal.lines.append(
                f"stopped   {scenario.source}  {name}: not finished"
                if index == 0
                else f"skipped   {scenario.source}  {name}: not started"
            )
        journal.running = None  # said above, in order after what finished
    merged = {"scenario": scenario.name, "source": scenario.source, "lane": lane, **_merged(reports, False)}
    merged.update(out.not_finished(scenario.name, not_finished))
    out.finish([merged])


def _real_figure(variant: dict[str, Any]) -> str:
    from simnccl.real.report import rank_outcomes

    outcomes = rank_outcomes(variant)
    unfinished = sum(1 for o in outcomes.values() if o["status"] != "done")
    parts = [f"{variant.get('wall_s', '?')} s wall"]
    if unfinished:
        parts.append(f"{unfinished} of {len(outcomes)} ranks did not finish")
    used = [d["used_mib"] for c in variant.get("checkpoints", []) for d in c["devices"]]
    if used:
        parts.append(f"peak {max(used):,.1f} MiB/GPU measured")
    return ", ".join(parts)


def _run(scenario: Any, settings: RunSettings, args: argparse.Namespace, out: Any) -> int:
    from simnccl.real.launch import Launcher, run_scenario_real
    from simnccl.real.report import render_run_header, render_run_variant
    from simnccl.real.torchrun_mode import torchrun_main, under_torchrun
    from simnccl.result import document

    if under_torchrun():

        def write(report: dict[str, Any]) -> None:
            (variant,) = report["variants"]
            line = SummaryLine(
                scenario.name, variant["name"], variant["verdict"], variant["verdict"] == "pass", _real_figure(variant)
            )
            if args.json is not None:
                out.write_json(document(out.command, [report], [line]))

        if len(scenario.variants) != 1:
            # Every variant but the first was dropped, and the report said PASS for what it ran (exit 0).
            names = ", ".join(v.name for v in scenario.variants)
            raise ScenarioError(
                scenario.source,
                "variants",
                f"under torchrun a launch runs one variant, and this run has {len(scenario.variants)} ({names}); "
                "choose one with --variant NAME (one torchrun launch each)",
            )
        return torchrun_main(scenario, scenario.variants[0], settings, write)
    if settings.lane == "gpu":
        from simnccl.real.lanes import check_gpu_lane

        check_gpu_lane(len(scenario.programs))
    out.print(render_run_header({"scenario": scenario.name, "source": scenario.source, "lane": settings.lane}))
    reports: list[dict[str, Any]] = []
    launcher = Launcher()
    try:
        with out.progress(len(scenario.variants), "variants on real torch") as bar:
            for variant in scenario.variants:
                _journal_running(scenario, variant.name)
                report = run_scenario_real(scenario, settings, [variant.name], launcher=launcher)
                with deferred_interrupt():  # a variant kept is a variant reported, or neither (Ctrl-C waits)
                    reports.append(report)
                    (result,) = report["variants"]
                    _journal_finished(scenario, variant.name, result["verdict"])
                    bar.advance(variant.name)
                    out.print(render_run_variant(result))
                    out.add(
                        SummaryLine(
                            scenario.name,
                            variant.name,
                            result["verdict"],
                            result["verdict"] == "pass",
                            _real_figure(result),
                        )
                    )
    except KeyboardInterrupt:
        _finish_interrupted(out, scenario, settings.lane, reports)
        raise  # simnccl.cli_guard: exit 130, the journal's lines say what finished
    finally:
        launcher.close()
    ok = all(line.ok for line in out.summary)
    return EXIT_OK if out.finish([_merged(reports, ok)]) else EXIT_FAILED


def _compare(scenario: Any, settings: RunSettings, args: argparse.Namespace, out: Any) -> int:
    from simnccl.real.compare import compare_scenario, render_comparison_header, render_comparison_variant
    from simnccl.real.launch import Launcher

    if settings.lane == "gpu":
        from simnccl.real.lanes import check_gpu_lane

        check_gpu_lane(len(scenario.programs))
    reports: list[dict[str, Any]] = []
    launcher = Launcher()
    try:
        with out.progress(len(scenario.variants), "variants compared") as bar:
            for variant in scenario.variants:
                _journal_running(scenario, variant.name)
                report = compare_scenario(
                    scenario, settings, variants=[variant.name], tolerance_pct=args.tolerance_pct, launcher=launcher
                )
                with deferred_interrupt():  # a variant kept is a variant reported, or neither (Ctrl-C waits)
                    if not reports:
                        out.print(render_comparison_header(report))
                    reports.append(report)
                    (result,) = report["variants"]
                    line = _comparison_line(scenario.name, result)
                    _journal_finished(scenario, variant.name, f"{line.verdict} ({line.figure})")
                    bar.advance(variant.name)
                    out.print(render_comparison_variant(result))
                    out.add(line)
    except KeyboardInterrupt:
        _finish_interrupted(out, scenario, settings.lane, reports)
        raise  # simnccl.cli_guard: exit 130, the journal's lines say what finished
    finally:
        launcher.close()
    ok = all(line.ok for line in out.summary)
    out.print("", _closing_line(ok, [v for r in reports for v in r["variants"]]))
    return EXIT_OK if out.finish([_merged(reports, ok)]) else EXIT_FAILED


def _closing_line(ok: bool, variants: list[dict[str, Any]]) -> str:
    """ALL AGREE, saying how many variants were not compared (a racy verdict: nothing can be), or DISAGREEMENT."""
    if not ok:
        return "DISAGREEMENT"
    racy = sum(1 for v in variants if v.get("verdict_racy"))
    return f"ALL AGREE ({racy} of {len(variants)} variant(s) not compared: racy)" if racy else "ALL AGREE"


def _comparison_line(scenario: str, variant: dict[str, Any]) -> SummaryLine:
    figure = f"sim {variant['sim_verdict']} | real {variant['real_verdict']}"
    errors = [row["error_pct"] for row in variant.get("memory", []) if row.get("error_pct") is not None]
    if errors:
        figure += f", memory error up to {max(errors, key=abs):+.1f}%"
    if variant["reasons"]:
        figure += f"; {variant['reasons'][0]}"
    state = "agree" if variant["agree"] else "disagree"
    if variant["agree"] and variant.get("verdict_racy"):  # counted as no disagreement, never as agreement
        state, figure = "not-compared", figure + f"; racy ({variant.get('race') or 'a race'}): nothing compared"
    return SummaryLine(scenario, variant["name"], state, variant["agree"], figure)


def _gpu_scenarios(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simnccl.profiles import ProfileError, get_profile
    from simnccl.real.calibrate import write_gpu_scenarios
    from simnccl.real.lanes import NO_CUDA, visible_gpus

    limit = RunSettings().max_ranks  # one local process per GPU, as the GPU lane runs them
    if args.ranks is not None and not 1 <= args.ranks <= limit:
        print(
            f"real: --ranks: expected an integer in [1, {limit}] (the GPU lane's local processes), got {args.ranks}",
            file=sys.stderr,
        )
        return 2
    ranks = args.ranks or min(visible_gpus(), 2)
    if ranks < 1:
        print(f"real: {NO_CUDA}", file=sys.stderr)
        return 2
    try:
        profile = get_profile(str(Path(args.profile).resolve()))
    except ProfileError as err:
        print(f"real: {err}", file=sys.stderr)
        return 2
    release = profile.releases[0]
    try:
        written = write_gpu_scenarios(Path(args.out), args.gpu_kind or profile.gpu, Path(args.profile), ranks, release)
    except OSError as err:  # an --out that is a file, or a folder no one can make or write in: bad input
        print(f"real: --out: cannot write the scenarios to {args.out!r}: {err.strerror or err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _diff_size_problem(args: argparse.Namespace) -> str | None:
    """Why ``real diff``'s sizes may not run (None: they may), checked before any case is generated."""
    from simnccl.limits import current as current_limits
    from simnccl.limits import exceeded

    limits = current_limits()
    cases = len(args.only) if args.only else args.count
    if args.only and any(index < 0 for index in args.only):
        return f"--only: expected case indices >= 0, got {min(args.only)}"
    if cases < 1:
        return f"--count: expected at least 1 case, got {args.count}"
    if cases > limits.max_real_cases:
        return f"--count: {exceeded('max_real_cases', f'{cases} cases', limits.max_real_cases)}"
    if args.parallel < 1:
        return f"--parallel: expected at least 1 world at a time, got {args.parallel}"
    if args.parallel > limits.max_real_parallel:
        shown = f"{args.parallel} worlds at a time"
        return f"--parallel: {exceeded('max_real_parallel', shown, limits.max_real_parallel)}"
    return None


def _diff(args: argparse.Namespace, out: Any) -> int:
    """Each case on real gloo and in the simulator, ``--parallel`` at a time, printed in order as they finish."""
    from concurrent.futures import ThreadPoolExecutor

    from simnccl.real.differential import cases, classify, generate, run_cases, summary
    from simnccl.real.launch import Launcher, RunSettings

    settings = RunSettings.for_lane("cpu", stall_s=args.stall or 5.0, timeout_s=args.timeout or 30.0)
    problem = _diff_size_problem(args)
    if problem is not None:
        out.error(problem)
        return EXIT_BAD_INPUT

    seed = args.seed if args.seed is not None else 0
    chosen = [generate(seed, i) for i in args.only] if args.only else cases(seed, args.count)
    results = []
    launcher = Launcher()
    # Not a ``with``: leaving one waits for every queued case, so Ctrl-C went on running all of them.
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    try:
        with out.progress(len(chosen), "cases") as bar:
            for (result,) in pool.map(
                lambda case: run_cases([case], launcher=launcher, settings=settings, parallel=1), chosen
            ):
                with deferred_interrupt():  # a case kept is a case reported, or neither (Ctrl-C waits)
                    results.append(result)
                    kind = classify(result)
                    bar.advance(result.case.name)
                    sim, real = result.comparison.sim["verdict"], result.comparison.real["verdict"]
                    mutation = result.case.mutation or "none"
                    if args.verbose or kind == "disagree":
                        out.print(result.describe(), "")
                    else:
                        out.print(f"{result.case.name}: {kind} (sim {sim}, real {real}, mutation {mutation})")
                    out.add(
                        SummaryLine(
                            f"diff seed {seed}",
                            result.case.name,
                            kind,
                            kind != "disagree",
                            f"sim {sim} | real {real}, mutation {mutation}",
                        )
                    )
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)  # queued cases never start
        launcher.close()  # the running worlds end with it
        _diff_interrupted(out, seed, chosen, results)
        raise  # simnccl.cli_guard: exit 130
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        launcher.close()
    out.print(summary(results))
    document = _diff_document(seed, results)
    return EXIT_OK if out.finish([document], show_summary=False) else EXIT_FAILED


def _diff_document(seed: int, results: Sequence[Any]) -> dict[str, Any]:
    from simnccl.real.differential import classify, summary

    records = [
        {
            "case": r.case.name,
            "kind": classify(r),
            "mutation": r.case.mutation,
            # A disagreement carries both sides in full (each rank's ops, status, log tail, the run's end reason):
            # whoever reads the JSON in CI can tell a simulator bug from a run stopped by a loaded machine.
            "comparison": r.comparison.to_dict(full=classify(r) == "disagree"),
        }
        for r in results
    ]
    return {"seed": seed, "summary": summary(results), "cases": records}


def _diff_interrupted(out: Any, seed: int, chosen: Sequence[Any], results: Sequence[Any]) -> None:
    """Ctrl-C: the summary and the JSON document of the cases that finished, marked ``interrupted`` with the
    cases that did not (each a summary line that is not ok, so the document's ``ok`` is false). Why: the pool
    ran every queued case before the interrupt was seen, and nothing was written."""
    from simnccl.runner import current_journal

    done = {r.case.name for r in results}
    not_finished = [case.name for case in chosen if case.name not in done]
    marks = out.not_finished(f"diff seed {seed}", not_finished)
    journal = current_journal()
    if journal is not None:
        journal.lines.append(f"finished  diff seed {seed}: {len(done)} of {len(chosen)} cases")
    out.finish([{**_diff_document(seed, results), **marks}], show_summary=False)


if __name__ == "__main__":
    # main() checks for torch before anything imports it. Guarded as `simnccl real` is: a crash exits 70, never 1
    # (exit 1 means a check failed), and Ctrl-C exits 130 with what finished.
    from simnccl.cli_guard import guarded

    sys.exit(guarded(main, command=("real",))())
