"""Environment knob names: a TORCH_*, PYTORCH_* or NCCL_* name must be one torch or NCCL reads.

Why: a scenario sets knobs by name, and neither torch nor NCCL complains about a name they do not read, so a
typo (``TORCH_DIST_USE_NCL2``) silently runs the default — the very thing the scenario meant to change. The
known names are data (``simnccl/data/env_knobs.toml``, with how they were extracted); an unknown one is bad
input whose message names the nearest known name. Other prefixes (``VLLM_*``, ``CUDA_VISIBLE_DEVICES``) are a
framework's or the driver's business and are not checked.
"""

from __future__ import annotations

import difflib
import importlib.resources
import re
import tomllib
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

CHECKED_PREFIXES = ("TORCH_", "PYTORCH_", "NCCL_")
# What an environment variable's name may be (a shell's rule): a scenario's, a sweep's and --env's names alike.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_env_name(name: object) -> bool:
    """Whether ``name`` can name an environment variable (a newline or a space in one split a report's line)."""
    return isinstance(name, str) and _ENV_NAME.fullmatch(name) is not None


# The knobs the engine reads itself (``simulated_knobs`` adds NCCL's memory model's).
_ENGINE_KNOBS = frozenset(
    {
        "NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_BLOCKING_WAIT",
        "NCCL_MULTI_RANK_GPU_ENABLE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_BLOCKING_WAIT",
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_FR_DUMP_ON_TIMEOUT",
        "TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC",
        "TORCH_NCCL_COORD_CHECK_MILSEC",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_ENABLE_MONITORING",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
    }
)


@cache
def simulated_knobs() -> frozenset[str]:
    """The NCCL_*, TORCH_NCCL_* and TORCH_FR_* knobs the simulation reads: a value of one changes what simnccl
    simulates (NCCL's memory model, ``nccl.knobs.MODEL_KNOBS``, imported when asked: the model is not light; and
    ``_ENGINE_KNOBS``: ProcessGroupNCCL's watchdog, error handling and flight recorder, shared GPUs).

    Why a list of its own: captured code may set such a knob in os.environ differently on different ranks, and
    simnccl simulates one environment for every rank, so such a capture is refused (``simnccl.capture.api``) where
    one nothing here reads (NCCL_DEBUG_FILE per rank) is only named. ``tests/test_env_knobs.py`` checks it against
    the names the code reads (every such quoted name in simnccl's sources is here or in ``REPORT_ONLY_KNOBS``, and
    every name here is read)."""
    from simnccl.nccl.knobs import MODEL_KNOBS

    return MODEL_KNOBS | _ENGINE_KNOBS


# Knobs simnccl reads only to name what a report points at (where the flight recorder's dumps go), never to decide
# what happens: captured code may set them per rank (a dump folder per rank), and is not refused for it.
REPORT_ONLY_KNOBS = frozenset({"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"})

DATA_FILE = "simnccl/data/env_knobs.toml"


@cache
def _data() -> dict[str, Any]:
    return tomllib.loads((importlib.resources.files("simnccl") / "data" / "env_knobs.toml").read_text(encoding="utf-8"))


@cache
def known_knobs() -> frozenset[str]:
    """Every knob name the data file lists (built once: a property run checks each generated case's env)."""
    return frozenset(name for names in _data()["names"].values() for name in names)


CVAR_TRUE = ("y", "yes", "1", "t", "true")
CVAR_FALSE = ("n", "no", "0", "f", "false")


@cache
def _boolean_knobs() -> frozenset[str]:
    return frozenset(_data()["boolean_values"]["names"])


def cvar_bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    """A boolean knob as torch's ``getCvarBool`` reads it (``value_problem`` refused any other value first)."""
    value = env.get(name)
    return default if value is None else value.lower() in CVAR_TRUE


def value_problem(name: str, value: str) -> str | None:
    """None when simnccl can use ``value`` for knob ``name``; else what it expected (integer and boolean knobs; and
    for every variable, a value a process environment can hold: no NUL, which ``os.environ`` refuses, so a real
    rank died on it where the simulation ran)."""
    if "\x00" in value:
        return "a NUL character in the value: no process environment can hold one"
    if name in _boolean_knobs():
        if value.lower() in CVAR_TRUE or value.lower() in CVAR_FALSE:
            return None
        return f"expected one of {', '.join(CVAR_TRUE + CVAR_FALSE)} (torch's getCvarBool), got {value[:40]!r}"
    bounds = _data()["integer_values"].get(name)
    if bounds is None:
        return None
    low, high = bounds
    text = value.strip()
    number = int(text) if re.fullmatch(r"-?[0-9]{1,12}", text) else None
    if number is None or not low <= number <= high:
        return f"expected an integer in {low}..{high} (as a string), got {value[:40]!r}"
    return None


# What torchrun sets in each rank's environment, from its own arguments: one value for every rank (an env table,
# ``--env``) would be wrong for all but one, and the simulation takes the world's shape from [cluster].
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)
# Of those, the ones whose value differs from rank to rank (the rest are one value per world): what a rank class
# (ranks that plan and decide alike) leaves out of its key, or there would be a class per rank.
PER_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK")
# torchrun's defaults for the store's address (``--master-addr``, ``--master-port``), and its ``--rdzv-id``.
MASTER_ADDR = "127.0.0.1"
MASTER_PORT = "29500"
RUN_ID = "none"
# torchrun sets this one unless the launching shell did (``os.getenv(..., str(1))``): 1, TearDown.
ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def torchrun_env(
    *, rank: int, local_rank: int, node: int, world_size: int, local_world_size: int, nodes: int, env: Mapping[str, str]
) -> dict[str, str]:
    """A worker's environment as torchrun's agent builds it (torch 2.15
    ``elastic/agent/server/local_elastic_agent.py``, ``_start_workers``): ``env`` (the launching shell's, a
    scenario's env table) plus every variable the agent sets, one role ("default"), no restart.

    Why all of them: a team's policy reads what its processes see; one that branches on ``LOCAL_WORLD_SIZE``
    ("groups within a node are free") took a branch in simulation that production never takes, because the
    simulated ranks saw only RANK, LOCAL_RANK and WORLD_SIZE. The simulator, the capture and the real lane's
    torchrun ranks all use this."""
    out = dict(env)
    out.update(
        RANK=str(rank),
        GROUP_RANK=str(node),
        ROLE_RANK=str(rank),
        ROLE_NAME="default",
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_world_size),
        WORLD_SIZE=str(world_size),
        GROUP_WORLD_SIZE=str(nodes),
        ROLE_WORLD_SIZE=str(world_size),
        MASTER_ADDR=MASTER_ADDR,
        MASTER_PORT=MASTER_PORT,
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_RUN_ID=RUN_ID,
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    out[ASYNC_ERROR_HANDLING] = env.get(ASYNC_ERROR_HANDLING, "1")
    return out


SCENARIO_DECLARES = "declare a newer one with [torch] extra_env_knobs"  # how a scenario file names a newer knob
# What a command without a scenario file (cost --workload, sweep's flags and tables) says instead.
NO_SCENARIO_DECLARES = "a newer one can only be set in a scenario file's own env, declared with [torch] extra_env_knobs"


def unknown_knob_message(name: str, extra: Iterable[str] = (), declare: str = SCENARIO_DECLARES) -> str | None:
    """None when ``name`` may be set; else why not, with the nearest known name (or, for a variable the launcher
    sets per rank, that it cannot be set for every rank: ``--env RANK=3`` was accepted and changed nothing)."""
    if name in LAUNCHER_VARIABLES:
        return (
            f"{name} is set per rank by the launcher (torchrun); simnccl gives every rank its own from the world's "
            "shape (a scenario's [cluster], a command's --world/--gpus-per-node): it cannot be set for all ranks"
        )
    if name != name.upper() and name.upper().startswith(CHECKED_PREFIXES):
        # Environment variables are case-sensitive and torch and NCCL read theirs in upper case: in production a
        # lower-case one changes nothing, whatever a simulation or an ``extra_env_knobs`` entry made of it.
        return (
            f"environment variable names are case-sensitive: torch and NCCL read {name.upper()!r}, "
            f"so {name!r} changes nothing"
        )
    if not name.startswith(CHECKED_PREFIXES):
        return None
    extra = frozenset(extra)
    if name in known_knobs() or name in extra:
        return None
    known = known_knobs() | extra
    # compared after the shared prefix: "NCCL_" alone made NCCL_FOOBAR "close" to NCCL_IB_OOO_RQ (found by a tester)
    prefix, _, rest = name.partition("_")
    same_prefix = {k.partition("_")[2]: k for k in known if k.partition("_")[0] == prefix}
    nearest = difflib.get_close_matches(rest, sorted(same_prefix), n=1, cutoff=0.6)
    hint = f"did you mean {same_prefix[nearest[0]]}?" if nearest else "no known knob is close"
    return (
        f"unknown environment knob {name!r}: {hint} (known {'/'.join(CHECKED_PREFIXES)}* names: {DATA_FILE}; {declare})"
    )


def env_problem(name: str, value: str, extra: Iterable[str] = (), declare: str = SCENARIO_DECLARES) -> str | None:
    """None when ``name=value`` may be set in a run's environment; else why not (``unknown_knob_message``, then
    ``value_problem``): the one check for env tables and every command's ``--env``. ``declare``: how the caller's
    input names a knob newer than the list (a scenario: ``[torch] extra_env_knobs``)."""
    return unknown_knob_message(name, extra, declare) or value_problem(name, value)
