"""The NCCL environment knobs and communicator options that change memory, parsed and validated.

Why one place: NCCL reads each knob once per communicator and some override a config field (an environment
``NCCL_MAX_CTAS`` wins over ``config.maxCTAs``, ``NCCL_COMM_SPLIT_SHARE_RESOURCES`` over ``splitShare``,
src/init.cc ``envConfigOverride``). Doing that precedence here keeps the model free of string parsing, and
bad values fail with the knob's name (exit 2 at the command line), never deep inside the model.

Knobs (all optional; unset means NCCL's default): ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS`` (ring and
tree channels), ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS`` (the same through the config, capped at 64),
``NCCL_MIN_P2P_NCHANNELS`` / ``NCCL_MAX_P2P_NCHANNELS`` (send/recv channels), ``NCCL_BUFFSIZE`` /
``NCCL_LL_BUFFSIZE`` / ``NCCL_LL128_BUFFSIZE`` (per-connection protocol buffers), ``NCCL_NVLS_ENABLE``,
``NCCL_NVLS_NCHANNELS``, ``NCCL_PROTO`` (tuning only: NCCL allocates every protocol's buffer whatever it
says), ``NCCL_ALGO`` (which algorithm a collective connects), ``NCCL_COMM_SPLIT_SHARE_RESOURCES``,
``NCCL_RUNTIME_CONNECT``, ``NCCL_CUMEM_ENABLE``, ``NCCL_COLLNET_ENABLE``, ``NCCL_WORK_FIFO_BYTES``,
``NCCL_NCHANNELS_PER_NET_PEER`` (send/recv channels per network peer; values <= 0 ignored, as NCCL does). Other
variables in the mapping are ignored (a scenario's environment holds torch's knobs too).

Options are the communicator config as torch's ``ProcessGroupNCCL.Options.config`` exposes it: ``max_ctas``,
``min_ctas``, ``split_share``, ``nvls_ctas``, ``collnet_enable``; plus ``cumem_supported`` (not a torch option:
whether the driver and container allow cuMem; false turns cuMem, and with it runtime connect, off).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from simnccl.nccl.constants import NcclInputError, constants
from simnccl.table_keys import check_keys

ALGORITHMS = ("tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
OPTION_KEYS = ("max_ctas", "min_ctas", "split_share", "nvls_ctas", "collnet_enable", "cumem_supported")
FLAG_OPTION_KEYS = ("split_share", "collnet_enable")  # the config fields the model reads as on/off (``option_value``)
_FUNCTIONS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv", "send", "recv")


@dataclass(frozen=True, slots=True)
class NcclSettings:
    """What a communicator's memory depends on besides topology and layout (None: NCCL's default)."""

    min_nchannels: int = 0
    max_nchannels: int | None = None
    min_ctas: int = 1
    max_ctas: int | None = None  # None: MAXCHANNELS
    min_p2p_nchannels: int = 1
    max_p2p_nchannels: int | None = None
    buffsize: int | None = None
    ll_buffsize: int | None = None
    ll128_buffsize: int | None = None
    nvls_enable: int = 2
    nvls_ctas: int | None = None
    proto: frozenset[str] | None = None
    algo: Mapping[str, frozenset[str]] | None = None  # function ("*" = all) -> allowed algorithms
    split_share: bool = False
    runtime_connect: bool = True
    cumem_enable: bool | None = None
    cumem_supported: bool = True
    collnet_enable: bool = False
    work_fifo_bytes: int | None = None
    nchannels_per_net_peer: int | None = None

    def algorithms_allowed(self, function: str) -> frozenset[str] | None:
        """The algorithms NCCL_ALGO allows for ``function`` (None: no restriction)."""
        if self.algo is None:
            return None
        return self.algo.get(function, self.algo.get("*"))


# NCCL reads an integer knob with ``strtoll(value, NULL, 0)`` (``ncclLoadParam``): C whitespace, a sign, then
# ``0x``/``0X`` and hex digits, ``0`` and octal digits, or decimal digits, all ASCII; it stops at the first other
# character and ignores the rest, and an out-of-range value (ERANGE) keeps the default.
_C_SPACE = " \t\n\v\f\r"
_STRTOLL = re.compile(
    rf"[{_C_SPACE}]*(?P<sign>[+-]?)(?:0[xX](?P<hex>[0-9a-fA-F]+)|(?P<oct>0[0-7]*)|(?P<dec>[1-9][0-9]*))"
)
_INT64_MAX = 2**63 - 1


def strtoll_prefix(text: str) -> tuple[int, bool]:
    """``text`` as NCCL's ``strtoll(text, NULL, 0)`` reads it: (value, whether it read all of it but trailing C
    whitespace). No digits read: (0, False), as strtoll returns 0. Out of int64's range: ValueError (NCCL keeps the
    knob's default there)."""
    match = _STRTOLL.match(text)
    if match is None:
        return 0, False
    if match.group("hex") is not None:
        value = int(match.group("hex"), 16)
    elif match.group("oct") is not None:
        value = int(match.group("oct"), 8)
    else:
        value = int(match.group("dec"), 10)
    value = -value if match.group("sign") == "-" else value
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"{text!r} is out of int64's range")
    return value, text[match.end() :].strip(_C_SPACE) == ""


def nccl_int(text: str) -> int:
    """An integer knob's value where NCCL would read all of it as that integer (``strtoll_prefix``); ValueError
    for anything NCCL would read otherwise than it looks (``0b1`` and ``1e3`` are 0 and 1 to NCCL, ``08`` is 0, a
    non-ASCII digit is no digit): refused, not guessed. ``010`` is 8, as NCCL reads it."""
    value, whole = strtoll_prefix(text)
    if not whole:
        raise ValueError(f"{text!r} is not an integer as NCCL reads one (strtoll, base 0)")
    return value


def _int(key: str, raw: Any, minimum: int) -> int:
    if isinstance(raw, bool):
        raise NcclInputError(f"{key}: expected an integer >= {minimum}, got {raw!r}")
    try:
        value = nccl_int(raw) if isinstance(raw, str) else int(raw)
    except (TypeError, ValueError):
        raise NcclInputError(
            f"{key}: expected an integer >= {minimum} (decimal, 0x hex or 0 octal, as NCCL reads it), got {raw!r}"
        ) from None
    if isinstance(raw, float) and raw != value:
        raise NcclInputError(f"{key}: expected an integer >= {minimum}, got {raw!r}")
    if value < minimum:
        raise NcclInputError(f"{key}: expected an integer >= {minimum}, got {raw!r}")
    return value


def _flag(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = _int(key, raw, 0)
    if value not in (0, 1):
        raise NcclInputError(f"{key}: expected 0 or 1, got {raw!r}")
    return value == 1


def _names(key: str, text: str, allowed: tuple[str, ...]) -> frozenset[str]:
    """NCCL's list syntax: ``A,B`` or ``^A,B`` (everything but A and B), case-insensitive."""
    text = text.strip()
    exclude = text.startswith("^")
    names = {name.strip().lower() for name in text.lstrip("^").split(",") if name.strip()}
    unknown = sorted(names - set(allowed))
    if not names or unknown:
        raise NcclInputError(f"{key}: expected a list of {', '.join(allowed)} (optionally ^-negated), got {text!r}")
    return frozenset(set(allowed) - names) if exclude else frozenset(names)


def _algo(raw: str) -> dict[str, frozenset[str]]:
    """``NCCL_ALGO``: ``Ring,Tree``, ``^NVLS`` or per function ``allreduce:ring;allgather:^pat``."""
    result: dict[str, frozenset[str]] = {}
    for clause in str(raw).split(";"):
        if not clause.strip():
            continue
        function, _, names = clause.rpartition(":")
        function = function.strip().lower() or "*"
        if function != "*" and function not in _FUNCTIONS:
            raise NcclInputError(f"NCCL_ALGO: unknown function {function!r}; expected one of {', '.join(_FUNCTIONS)}")
        result[function] = _names("NCCL_ALGO", names, ALGORITHMS)
    if not result:
        raise NcclInputError(f"NCCL_ALGO: expected a list of {', '.join(ALGORITHMS)}, got {raw!r}")
    return result


def _proto(raw: str) -> frozenset[str]:
    return frozenset().union(
        *(_names("NCCL_PROTO", part.rpartition(":")[2], PROTOCOLS) for part in str(raw).split(";"))
    )


def option_value(key: str, value: Any) -> Any:
    """A config field's value as the model reads it: an on/off field (torch's NCCLConfig holds an int) as a bool."""
    return bool(value) if key in FLAG_OPTION_KEYS else value


def nccl_config_problem(field: str, value: Any) -> str | None:
    """What is wrong with one ``PgOptions`` field the model reads (``min_ctas``, ``max_ctas``, ``nvls_ctas``...) set
    to ``value``, as ``settings_from`` would say it (None: nothing, or a field the model does not read).

    Why: a scenario step with ``max_ctas = -1`` passed the loader and then stopped the simulation with this
    model's error, reported as a bug in simnccl (exit 70); the loader asks here, so it is bad input (exit 2)
    naming the step's key, by the model's own rule."""
    if field not in OPTION_KEYS:
        return None
    try:
        settings_from({}, {field: option_value(field, value)})
    except NcclInputError as err:
        return str(err).removeprefix(f"options.{field}: ")
    return None


# The environment knobs ``settings_from`` reads: for these, two values (or a value and none) that give every
# communicator the same settings are the same to NCCL's memory model.
MODEL_KNOBS = frozenset(
    {
        "NCCL_ALGO",
        "NCCL_BUFFSIZE",
        "NCCL_COLLNET_ENABLE",
        "NCCL_COMM_SPLIT_SHARE_RESOURCES",
        "NCCL_CUMEM_ENABLE",
        "NCCL_LL128_BUFFSIZE",
        "NCCL_LL_BUFFSIZE",
        "NCCL_MAX_CTAS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MAX_P2P_NCHANNELS",
        "NCCL_MIN_CTAS",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MIN_P2P_NCHANNELS",
        "NCCL_NCHANNELS_PER_NET_PEER",
        "NCCL_NVLS_ENABLE",
        "NCCL_NVLS_NCHANNELS",
        "NCCL_PROTO",
        "NCCL_RUNTIME_CONNECT",
        "NCCL_WORK_FIFO_BYTES",
    }
)


def same_to_the_model(
    name: str, values: Collection[str | None], option_sets: Collection[Mapping[str, Any]] = ({},)
) -> bool:
    """Whether every value of knob ``name`` in ``values`` (None: unset) gives NCCL's memory model the same settings
    under each communicator config of ``option_sets`` (an environment knob overrides its config field:
    ``NCCL_COLLNET_ENABLE=0`` is NCCL's default unless a group asked for collnet). False for a knob the model does
    not read (``MODEL_KNOBS``), whose values are then told apart as they are written, and for a value NCCL's
    model refuses.

    Why: Megatron's SHARP set ``NCCL_COLLNET_ENABLE=0`` after its groups, which is what NCCL assumes unset: a
    capture refused it as a knob the ranks changed while their communicators were being made."""
    if len(set(values)) <= 1:
        return True
    if name not in MODEL_KNOBS:
        return False
    try:
        return all(
            len({settings_from({} if v is None else {name: v}, options) for v in values}) == 1
            for options in option_sets
        )
    except NcclInputError:
        return False


def settings_from(env: Mapping[str, str] | None = None, options: Mapping[str, Any] | None = None) -> NcclSettings:
    """Settings for one communicator: ``options`` (its config) first, then the environment, which wins.

    Raises NcclInputError naming the knob for a bad value or an unknown option.
    """
    env = dict(env or {})
    options = dict(options or {})
    check_keys(options, allowed=OPTION_KEYS, file="", path="options", error=NcclInputError)
    max_channels = constants().integer("channels.max_channels")
    fields: dict[str, Any] = {}
    # Config fields, then their environment overrides (src/init.cc envConfigOverride): env values <= 0 are
    # ignored by NCCL for the CTA knobs, so they are here too.
    min_ctas = _int("options.min_ctas", options["min_ctas"], 1) if "min_ctas" in options else 1
    max_ctas = _int("options.max_ctas", options["max_ctas"], 1) if "max_ctas" in options else max_channels
    if "NCCL_MIN_CTAS" in env and _int("NCCL_MIN_CTAS", env["NCCL_MIN_CTAS"], -(2**31)) > 0:
        min_ctas = _int("NCCL_MIN_CTAS", env["NCCL_MIN_CTAS"], 1)
    if "NCCL_MAX_CTAS" in env and _int("NCCL_MAX_CTAS", env["NCCL_MAX_CTAS"], -(2**31)) > 0:
        max_ctas = _int("NCCL_MAX_CTAS", env["NCCL_MAX_CTAS"], 1)
    min_ctas, max_ctas = min(min_ctas, max_channels), min(max_ctas, max_channels)
    fields["min_ctas"] = min(min_ctas, max_ctas)
    fields["max_ctas"] = max_ctas
    split_share = _flag("options.split_share", options["split_share"]) if "split_share" in options else False
    if "NCCL_COMM_SPLIT_SHARE_RESOURCES" in env:
        split_share = _flag("NCCL_COMM_SPLIT_SHARE_RESOURCES", env["NCCL_COMM_SPLIT_SHARE_RESOURCES"])
    fields["split_share"] = split_share
    nvls_ctas = _int("options.nvls_ctas", options["nvls_ctas"], 1) if "nvls_ctas" in options else None
    if "NCCL_NVLS_NCHANNELS" in env:
        nvls_ctas = _int("NCCL_NVLS_NCHANNELS", env["NCCL_NVLS_NCHANNELS"], 1)
    fields["nvls_ctas"] = nvls_ctas
    collnet = _flag("options.collnet_enable", options["collnet_enable"]) if "collnet_enable" in options else False
    if "NCCL_COLLNET_ENABLE" in env:
        collnet = _flag("NCCL_COLLNET_ENABLE", env["NCCL_COLLNET_ENABLE"])
    fields["collnet_enable"] = collnet
    if "cumem_supported" in options:
        fields["cumem_supported"] = _flag("options.cumem_supported", options["cumem_supported"])

    if "NCCL_MIN_NCHANNELS" in env:
        fields["min_nchannels"] = min(_int("NCCL_MIN_NCHANNELS", env["NCCL_MIN_NCHANNELS"], 0), max_channels)
    if "NCCL_MAX_NCHANNELS" in env:  # NCCL: below 1 means 1, above MAXCHANNELS means MAXCHANNELS
        value = _int("NCCL_MAX_NCHANNELS", env["NCCL_MAX_NCHANNELS"], -(2**31))
        fields["max_nchannels"] = min(max(value, 1), max_channels)
    if "NCCL_MIN_P2P_NCHANNELS" in env:
        fields["min_p2p_nchannels"] = _int("NCCL_MIN_P2P_NCHANNELS", env["NCCL_MIN_P2P_NCHANNELS"], 1)
    if "NCCL_MAX_P2P_NCHANNELS" in env:
        fields["max_p2p_nchannels"] = _int("NCCL_MAX_P2P_NCHANNELS", env["NCCL_MAX_P2P_NCHANNELS"], 1)
    for key, name in (("NCCL_BUFFSIZE", "buffsize"), ("NCCL_LL_BUFFSIZE", "ll_buffsize")):
        if key in env:
            fields[name] = _int(key, env[key], 1)
    if "NCCL_LL128_BUFFSIZE" in env:
        fields["ll128_buffsize"] = _int("NCCL_LL128_BUFFSIZE", env["NCCL_LL128_BUFFSIZE"], 1)
    if "NCCL_NVLS_ENABLE" in env:
        value = _int("NCCL_NVLS_ENABLE", env["NCCL_NVLS_ENABLE"], 0)
        if value not in (0, 1, 2):
            raise NcclInputError(f"NCCL_NVLS_ENABLE: expected 0, 1 or 2, got {env['NCCL_NVLS_ENABLE']!r}")
        fields["nvls_enable"] = value
    if "NCCL_PROTO" in env:
        fields["proto"] = _proto(env["NCCL_PROTO"])
    if "NCCL_ALGO" in env:
        fields["algo"] = _algo(env["NCCL_ALGO"])
    if "NCCL_RUNTIME_CONNECT" in env:
        fields["runtime_connect"] = _flag("NCCL_RUNTIME_CONNECT", env["NCCL_RUNTIME_CONNECT"])
    if "NCCL_CUMEM_ENABLE" in env:
        fields["cumem_enable"] = _flag("NCCL_CUMEM_ENABLE", env["NCCL_CUMEM_ENABLE"])
    if "NCCL_NCHANNELS_PER_NET_PEER" in env:  # src/init.cc envConfigOverride: <= 0 keeps the config's value
        value = _int("NCCL_NCHANNELS_PER_NET_PEER", env["NCCL_NCHANNELS_PER_NET_PEER"], -(2**31))
        fields["nchannels_per_net_peer"] = value if value > 0 else None
    if "NCCL_WORK_FIFO_BYTES" in env:
        value = _int("NCCL_WORK_FIFO_BYTES", env["NCCL_WORK_FIFO_BYTES"], 1)
        if value & (value - 1):  # NCCL ignores a non-power of two and keeps the default
            value = constants().integer("buffers.work_fifo_bytes")
        fields["work_fifo_bytes"] = value
    return NcclSettings(**fields)
