"""``simnccl real run|compare|diff|calibrate|gpu-scenarios`` (also ``python -m simnccl.real ...``): the verification
tier's command line.

Exit codes: 0 pass / agreement; 1 a run that did not pass, or a disagreement; 2 bad input or a lane that cannot run
here (no CUDA device for the GPU lane, more ranks than GPUs).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from simnccl.real.lanes import LANES, LaneError
from simnccl.scenario import ScenarioError, load_scenario


def _settings(args: argparse.Namespace):
    from simnccl.real.launch import RunSettings

    return RunSettings.for_lane(
        args.lane,
        timeout_s=args.timeout,
        torch_timeout_s=args.torch_timeout,
        stall_s=args.stall,
        compute_scale=args.compute_scale,
        keep_dir=args.keep or None,
    )


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario TOML file")
    parser.add_argument("--variant", action="append", help="run only this variant (repeatable)")
    parser.add_argument("--lane", choices=LANES, default="cpu", help="cpu: gloo substituted (default); gpu: NCCL")
    parser.add_argument("--timeout", type=float, help="wall-clock limit of one run in seconds (cpu 60, gpu 300)")
    parser.add_argument(
        "--torch-timeout", type=float, help="timeout passed to group creation (cpu 90 s: hangs are found by --stall)"
    )
    parser.add_argument("--stall", type=float, help="no progress for this long is a hang (cpu 6 s, gpu 120 s)")
    parser.add_argument("--compute-scale", type=float, help="compute ops sleep seconds x this (cpu 0, gpu 0.01)")
    parser.add_argument("--keep", action="store_true", help="keep the per-rank progress files and logs")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE ('-': stdout)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simnccl real", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario on real torch.distributed (spawned locally, or under torchrun)")
    _common(run)
    compare = sub.add_parser("compare", help="run the simulator and real torch on a scenario, side by side")
    _common(compare)
    compare.add_argument("--tolerance-pct", type=float, default=10.0, help="GPU lane: allowed memory error (%%)")
    diff = sub.add_parser("diff", help="differential test: generated programs on real gloo and in the simulator")
    diff.add_argument("--seed", type=int, default=0)
    diff.add_argument("--count", type=int, default=50, help="number of generated cases (2-4 ranks, <= 12 ops)")
    diff.add_argument("--only", type=int, action="append", help="run only case INDEX of the seed (repeatable)")
    diff.add_argument("--parallel", type=int, default=3, help="worlds run at once (hung ranks mostly sleep)")
    diff.add_argument("--verbose", action="store_true", help="print every case, not only disagreements")
    calibrate = sub.add_parser("calibrate", help="GPU lane: measure a profile (needs CUDA)")
    calibrate.add_argument("--out", required=True, help="profile TOML to write, e.g. simnccl/profiles/NAME.toml")
    calibrate.add_argument("--gpu-kind", help="simnccl GPU kind key (default: guessed from the device name)")
    calibrate.add_argument("--timeout", type=float, default=420.0, help="wall-clock limit of the suite in seconds")
    calibrate.add_argument("--json", metavar="FILE", help="also write the raw measurements as JSON")
    scen = sub.add_parser("gpu-scenarios", help="write the GPU check scenarios for this machine (gpu_check.sh)")
    scen.add_argument("--out", required=True, help="folder to write them to")
    scen.add_argument("--profile", required=True, help="the profile they are priced by (e.g. the calibrated one)")
    scen.add_argument("--gpu-kind", help="simnccl GPU kind key (default: the profile's)")
    scen.add_argument("--ranks", type=int, help="ranks per world (default: visible GPUs, at most 2)")
    args = parser.parse_args(argv)

    if args.command == "gpu-scenarios":
        return _gpu_scenarios(args)
    if args.command == "diff":
        return _diff(args)
    if args.command == "calibrate":
        from simnccl.real.calibrate import main as calibrate_main

        return calibrate_main(args)
    try:
        scenario = load_scenario(args.scenario)
        if args.variant:
            for name in args.variant:
                scenario.variant(name)
    except ScenarioError as err:
        print(f"real: {err}", file=sys.stderr)
        return 2
    try:
        settings = _settings(args)
        if args.command == "run":
            return _run(scenario, settings, args)
        return _compare(scenario, settings, args)
    except LaneError as err:
        print(f"real: {err}", file=sys.stderr)
        return 2


def _write_json(target: str | None, report: dict) -> None:
    if not target:
        return
    text = json.dumps(report, indent=2, default=str)
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text + "\n", encoding="utf-8")


def _run(scenario, settings, args: argparse.Namespace) -> int:
    from simnccl.real.launch import run_scenario_real, torchrun_main, under_torchrun
    from simnccl.real.report import render_run

    if under_torchrun():
        variant = scenario.variant(args.variant[0]) if args.variant else scenario.variants[0]
        return torchrun_main(scenario, variant, settings, Path(args.json) if args.json and args.json != "-" else None)
    if settings.lane == "gpu":
        from simnccl.real.lanes import check_gpu_lane

        check_gpu_lane(len(scenario.programs))
    report = run_scenario_real(scenario, settings, args.variant)
    print(render_run(report))
    _write_json(args.json, report)
    return 0 if all(v["verdict"] == "pass" for v in report["variants"]) else 1


def _compare(scenario, settings, args: argparse.Namespace) -> int:
    from simnccl.real.compare import compare_scenario, render_comparison

    if settings.lane == "gpu":
        from simnccl.real.lanes import check_gpu_lane

        check_gpu_lane(len(scenario.programs))
    report = compare_scenario(scenario, settings, variants=args.variant, tolerance_pct=args.tolerance_pct)
    print(render_comparison(report))
    _write_json(args.json, report)
    return 0 if report["ok"] else 1


def _gpu_scenarios(args: argparse.Namespace) -> int:
    from simnccl.profiles import ProfileError, get_profile
    from simnccl.real.calibrate import write_gpu_scenarios
    from simnccl.real.lanes import NO_CUDA, visible_gpus

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
    for path in write_gpu_scenarios(Path(args.out), args.gpu_kind or profile.gpu, Path(args.profile), ranks, release):
        print(path)
    return 0


def _diff(args: argparse.Namespace) -> int:
    from simnccl.real.differential import cases, classify, generate, run_cases, summary

    chosen = [generate(args.seed, i) for i in args.only] if args.only else cases(args.seed, args.count)
    results = run_cases(chosen, parallel=args.parallel)
    for result in results:
        kind = classify(result)
        if args.verbose or kind == "disagree":
            print(result.describe())
            print()
        else:
            print(
                f"{result.case.name}: {kind} (sim {result.comparison.sim['verdict']}, "
                f"real {result.comparison.real['verdict']}, mutation {result.case.mutation or 'none'})"
            )
    print(summary(results))
    return 1 if any(classify(r) == "disagree" for r in results) else 0


if __name__ == "__main__":
    from simnccl.prerequisites import MissingPrerequisite, require_torch

    try:
        require_torch("python -m simnccl.real")  # before anything imports it: one line, exit 2, no traceback
    except MissingPrerequisite as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
