"""torchrun mode: this process is one rank of a torchrun world; rank 0 prints the report.

The ranks coordinate over torchrun's store; a watchdog thread ends a rank that passes the timeout (torchrun then
stops the others), after publishing where it was so that rank 0's report still names every rank's last op.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simnccl.cli_guard import end_without_teardown
from simnccl.real.lanes import check_gpu_lane
from simnccl.real.launch import (
    RankWatch,
    RunSettings,
    compute_problem,
    inherited_knobs,
    inherited_note,
    installed_torch_version,
    lane_programs,
    raise_user_policy_error,
    rank_gpu,
    run_document,
)
from simnccl.real.measure import build_variant_result
from simnccl.scenario import Scenario, Variant


def under_torchrun(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env


def torchrun_main(
    scenario: Scenario, variant: Variant, settings: RunSettings, out: Callable[[dict[str, Any]], None] | None
) -> int:
    """This process is one rank of a torchrun world. Rank 0 prints the report (and hands it to ``out``)."""
    import datetime

    import torch.distributed as dist

    from simnccl.real.driver import Driver, Progress, RankSpec, prepare_env

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    programs, substitutions, notes = lane_programs(scenario, settings.lane, settings)
    if world != len(programs):
        print(f"real: torchrun world of {world} but the scenario has {len(programs)} ranks", file=sys.stderr)
        return 2
    problem = compute_problem(programs, settings, stall_watched=False)
    if problem is not None:  # the watchdog would stop a healthy run as hung: bad input, as in local mode
        print(f"real: {problem}", file=sys.stderr)
        return 2
    if settings.lane == "gpu":
        check_gpu_lane(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    # What this rank inherits from torchrun's environment, read before the variant's env is applied to it.
    inherited = inherited_knobs(os.environ, variant.env)
    note = inherited_note(inherited)
    if note:
        notes = [*notes, note]
    gpu, profile, gpu_notes = rank_gpu(variant, settings.lane)
    notes = [*notes, *gpu_notes]
    started = time.time()
    end_without_teardown()  # from here on torch's groups live to the end: see why there
    base, _, _ = next(dist.rendezvous("env://", rank, world, timeout=datetime.timedelta(seconds=settings.timeout_s)))
    control = dist.PrefixStore("real/control", base)
    spec = RankSpec(
        rank=rank,
        world_size=world,
        program=programs[rank].to_list(),
        lane=settings.lane,
        policy=variant.policy,
        gpu=gpu,
        profile=profile,
        env=dict(variant.env),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        node=int(os.environ.get("GROUP_RANK", "0")),
        set_launcher_env=False,  # torchrun has set them
        torch_timeout_s=settings.torch_timeout_s,
        init_timeout_s=settings.init_timeout_s,
        compute_scale=settings.compute_scale,
        compute_cap_s=settings.compute_cap_s,
    )
    prepare_env(spec)
    watch = RankWatch(rank, Path(os.devnull), Path(os.devnull), pid=os.getpid())
    lock = threading.Lock()

    def publish(record: dict[str, Any]) -> None:
        with lock:
            watch._apply(record)

    def snapshot(killed: bool) -> str:
        with lock:
            return json.dumps(
                {
                    "rank": rank,
                    "pid": os.getpid(),
                    "ops": [watch.ops[i] for i in sorted(watch.ops)],
                    "current": watch.current,
                    "final": watch.final,
                    "killed": killed,
                    "exit_code": None,
                    "exit_t": time.time(),
                },
                default=str,
            )

    def watchdog() -> None:
        deadline = started + settings.timeout_s
        while time.time() < deadline:
            if watch.final is not None:
                return
            time.sleep(0.1)
        with contextlib.suppress(Exception):
            control.set(f"state/{rank}", snapshot(True))
        if rank == 0:
            with contextlib.suppress(Exception):
                _torchrun_report(
                    control, world, scenario, variant, settings, started, substitutions, notes, out, inherited
                )
        else:  # let rank 0 read our state before torchrun stops the world on our exit
            control_wait(control, ["report"], 10.0)
        sys.stdout.flush()
        # A run stopped past its timeout did not pass: exit 1, the report's own code for a hang. (It was 124,
        # timeout(1)'s code, which is none of simnccl's; torchrun names whichever code in its failure report.)
        os._exit(1)

    threading.Thread(target=watchdog, name="real-watchdog", daemon=True).start()
    progress = Progress("", extra=publish)
    driver = Driver(spec, programs[rank], progress)
    driver.store = dist.PrefixStore("real/run", base)
    final = driver.run()
    progress.write(final)
    control.set(f"state/{rank}", snapshot(False))
    control.add("finals", 1)
    code = 0
    if rank == 0:
        code = _torchrun_report(
            control, world, scenario, variant, settings, started, substitutions, notes, out, inherited
        )
    else:
        spec.park_max_s = max(0.0, started + settings.timeout_s - time.time())
        control_wait(control, ["report"], spec.park_max_s)
    return code


def control_wait(store: Any, keys: list[str], timeout_s: float) -> bool:
    import datetime

    try:
        store.wait(keys, datetime.timedelta(seconds=max(timeout_s, 0.1)))
        return True
    except Exception:
        return False


def _torchrun_report(
    control: Any,
    world: int,
    scenario: Scenario,
    variant: Variant,
    settings: RunSettings,
    started: float,
    substitutions: list[str],
    notes: list[str],
    out: Callable[[dict[str, Any]], None] | None,
    inherited: Mapping[str, str],
) -> int:
    """Rank 0's report of the world; ``inherited``: rank 0's ``inherited_knobs`` (its node's environment)."""
    deadline = started + settings.timeout_s
    while time.time() < deadline:
        if int(control.add("finals", 0)) >= world:
            break
        time.sleep(0.1)
    states = []
    for r in range(world):
        if control_wait(control, [f"state/{r}"], 3.0):
            states.append(json.loads(control.get(f"state/{r}")))
        else:
            states.append({"rank": r, "ops": [], "current": None, "final": None, "killed": True, "exit_code": None})
    reason = "finished" if all(s.get("final") for s in states) else f"wall-clock timeout of {settings.timeout_s:g}s"
    result = build_variant_result(
        name=variant.name,
        description=variant.description,
        lane=settings.lane,
        policy=variant.policy,
        env=dict(variant.env),
        release=variant.release,
        torch_version=installed_torch_version(),
        rank_states=states,
        reason=reason,
        started_at=started,
        substitutions=substitutions,
        notes=[*notes, "launched by torchrun"],
        settings=settings.to_dict(),
    )
    result["inherited_env"] = dict(inherited)
    result["wall_s"] = round(time.time() - started, 3)  # as the local launcher's results say it ("? s wall")
    report = run_document(scenario, settings.lane, [result])
    from simnccl.real.report import render_run

    print(render_run(report))
    if out is not None:
        out(report)
    control.set("report", "1")
    raise_user_policy_error(result)  # after the report: the other ranks wait for it
    return 0 if result["verdict"] == "pass" else 1
