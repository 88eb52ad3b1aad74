"""Policy specs: the one way a policy is named — in scenario TOML, on every command line, in case files.

A spec is parts joined with ``+`` (each refines the decision of the ones before it). A part is

* a built-in name (``dedupe``, ``lazy-init`` ...) or ``budget(MiB[,per_group_MiB])``;
* an import spec ``package.module:Name`` (``Name`` may be dotted: ``module:Outer.Inner``) naming a policy
  *class* (instantiated with no arguments) or a policy *object*;
* a name registered by an installed package under the entry-point group ``simnccl.policies``
  (``[project.entry-points."simnccl.policies"] acme-safe = "acme.policies:SafePolicy"``).

A whole spec may also be ``as-captured(SPEC)``: a capture's Programs made under ``SPEC``, replayed as decided
(``simnccl.policy.as_captured``; what ``simnccl capture --toml`` writes).

Why this shape: a team's own policy must be first-class wherever a built-in is (DESIGN rule 10), and it must
survive a round trip through a file: a failing property test dumps its case, and ``python -m
simnccl.testing.replay`` rebuilds the same policy in a fresh process. ``describe_policy`` gives a JSON-able
description (the spec, plus a user dataclass's field values and the file its class was defined in) that
``policy_from_description`` turns back into an equal policy.

What is never done with a spec (scenario files are untrusted, DESIGN rule 9): nothing is evaluated; a part
must look like a dotted Python name; only modules importable in this environment are imported (never a file
path from the spec); and the object found must already look like a policy (``on_group`` or ``on_init`` on it, or
on the class) before a class is instantiated. Functions are not called.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from simnccl.os_exit import os_exit_raises
from simnccl.policy.as_captured import SPEC_PREFIX as AS_CAPTURED
from simnccl.policy.as_captured import AsCaptured, captured_policy
from simnccl.policy.builtins import BUILTIN, BasePolicy, BudgetPolicy, ComposedPolicy
from simnccl.policy.plans import Policy, PolicyCalledExit, PolicyError, policy_raised
from simnccl.visible_text import repr_text

ENTRY_POINT_GROUP = "simnccl.policies"
MAX_SPEC_CHARS = 2_000  # a spec is a short line; anything longer is not a policy name (untrusted input)
MAX_PARTS = 16

_BUDGET = re.compile(r"^budget\((?P<mib>[0-9]+(?:\.[0-9]+)?)(?:,(?P<per>[0-9]+(?:\.[0-9]+)?))?\)$")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_IMPORT_SPEC = re.compile(rf"^(?P<module>{_DOTTED}):(?P<name>{_DOTTED})$")
_EP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def get_policy(spec: str | Policy) -> Policy:
    """The policy a spec names (see the module docstring); a policy object is returned as it is.

    ``"legacy"``, ``"dedupe+lazy-single-rank"``, ``"budget(2048,231.1)"``, ``"acme.policies:SafePolicy"``,
    ``"acme-safe+lazy-single-rank"`` (an entry-point name). Raises ``PolicyError`` with a one-line reason.
    The policy's module and constructor run with ``os._exit`` raising (``simnccl.os_exit``).
    """
    with os_exit_raises(PolicyCalledExit):
        return _get_policy(spec)


def _get_policy(spec: str | Policy) -> Policy:
    if not isinstance(spec, str):
        if inspect.isclass(spec):  # as an import spec naming a class: instantiated (its hooks are methods)
            return _instantiate(spec, spec.__qualname__)
        return _checked(spec, repr(spec))
    if len(spec) > MAX_SPEC_CHARS:
        raise PolicyError(f"policy spec of {len(spec)} characters: longer than the limit of {MAX_SPEC_CHARS}")
    compact = spec.replace(" ", "")
    replayed = captured_policy(compact)
    if replayed is not None:  # a capture's calls, replayed as decided
        inner = _get_policy(replayed)
        if isinstance(inner, AsCaptured):
            raise PolicyError(f"policy spec {spec!r}: as-captured(...) inside as-captured(...) means nothing more")
        return AsCaptured(inner)
    raw_parts = compact.split("+")
    if len(raw_parts) > MAX_PARTS:
        raise PolicyError(f"policy spec with {len(raw_parts)} parts: more than the limit of {MAX_PARTS}")
    parts = [_part(raw, spec) for raw in raw_parts]
    if not parts:  # pragma: no cover - split always yields one part
        raise PolicyError("empty policy spec")
    return parts[0] if len(parts) == 1 else ComposedPolicy(tuple(parts))


def _part(raw: str, spec: str) -> Policy:
    if not raw:
        raise PolicyError(f"empty part in policy spec {spec!r}")
    match = _BUDGET.match(raw)
    if match:
        per = match.group("per")
        return BudgetPolicy(
            max_mib_per_device=float(match.group("mib")), **({"per_group_mib": float(per)} if per else {})
        )
    if raw in BUILTIN:
        return BUILTIN[raw]()
    if ":" in raw:
        return _from_import_spec(raw)
    entry = _entry_point(raw)
    if entry is not None:
        try:
            loaded = entry.load()
        except BaseException as error:  # the user's module failed to import: say which and why, in one line
            if not policy_raised(error):
                raise
            raise PolicyError(
                f"policy {raw!r} (entry point {entry.value!r}): import failed: {repr_text(error)}"
            ) from None
        return _instantiate(loaded, f"{raw} (entry point {entry.value})")
    known = ", ".join([*BUILTIN, "budget(MiB)", "budget(MiB,per_group_MiB)", *entry_point_names()])
    raise PolicyError(
        f"unknown policy {raw!r} in {spec!r}; expected one of {known}, an import spec 'package.module:Name', "
        "joined with '+' (or a whole spec as-captured(SPEC): a capture's steps, replayed)"
    )


def spec_modules(spec: str) -> list[str]:
    """The modules a spec's import parts (``module:Name``) and entry points name, in order: where the objects it
    loads are made (``policy.sources`` digests their files). A part that names neither gives none."""
    compact = spec.replace(" ", "")
    replayed = captured_policy(compact)
    if replayed is not None:
        return spec_modules(replayed)
    modules = []
    for raw in compact.split("+")[:MAX_PARTS]:
        match = _IMPORT_SPEC.match(raw)
        if match is None and raw not in BUILTIN and _EP_NAME.match(raw):
            entry = _entry_point(raw)
            match = None if entry is None else _IMPORT_SPEC.match(entry.value.replace(" ", ""))
        if match is not None:
            modules.append(match.group("module"))
    return modules


def _from_import_spec(raw: str) -> Policy:
    match = _IMPORT_SPEC.match(raw)
    if match is None:
        raise PolicyError(f"policy {raw!r}: an import spec is 'package.module:Name' (dotted Python names)")
    module_name, attribute = match.group("module"), match.group("name")
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as error:
        raise PolicyError(
            f"policy {raw!r}: module {module_name!r} is not importable here ({error}); install the package that "
            "provides it, or run from the folder that holds it"
        ) from None
    except BaseException as error:
        if not policy_raised(error):
            raise
        raise PolicyError(f"policy {raw!r}: importing {module_name!r} failed: {repr_text(error)}") from None
    return _instantiate(_attribute(module, module_name, attribute, f"policy {raw!r}"), raw)


def _attribute(module: Any, module_name: str, dotted: str, what: str) -> Any:
    """``module.A.B`` for ``dotted`` = ``"A.B"``; ``PolicyError`` naming ``what`` when a step is missing."""
    obj = module
    for name in dotted.split("."):
        if not hasattr(obj, name):
            raise PolicyError(f"{what}: {module_name!r} has no attribute {dotted!r}")
        obj = getattr(obj, name)
    return obj


def _import_module(module_name: str) -> Any:
    """Import ``module_name``; a module in the current folder counts too, as it does for ``python -m`` (the
    ``simnccl`` console script does not put the folder on ``sys.path``). The folder goes *last*, so it never
    shadows an installed module."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        top = module_name.split(".")[0]
        here = str(Path.cwd())
        if error.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def _looks_like_policy(obj: object) -> bool:
    return callable(getattr(obj, "on_group", None)) or callable(getattr(obj, "on_init", None))


def _instantiate(obj: object, where: str) -> Policy:
    """A policy from what a spec names: an object as it is, a class instantiated with no arguments."""
    if inspect.isclass(obj):
        if not _looks_like_policy(obj):
            raise PolicyError(f"policy {where}: class {obj.__qualname__} has no on_group/on_init: not a policy")
        try:
            instance = obj()
        except TypeError as error:
            raise PolicyError(
                f"policy {where}: {obj.__qualname__}() needs arguments ({error}); give its fields defaults, or "
                "name a module-level instance instead"
            ) from None
        except BaseException as error:
            # Its own failure, named, as a failed import is: every caller (--policy, a scenario's policy keys,
            # [matrix], simulate) then reports bad input, where a bare RuntimeError crashed the CLI (exit 70).
            if not policy_raised(error):
                raise
            raise PolicyError(f"policy {where}: {obj.__qualname__}() raised {repr_text(error)}") from error
        return _checked(instance, where)
    return _checked(obj, where)


def _checked(obj: object, where: str) -> Policy:
    if not _looks_like_policy(obj):
        raise PolicyError(f"policy {where}: {type(obj).__name__} object has no on_group/on_init: not a policy")
    try:
        name = getattr(obj, "name", None)
    except Exception as error:  # a property of the user's that raises: their error, named
        raise PolicyError(f"policy {where}: reading its 'name' raised {repr_text(error)}") from None
    if not isinstance(name, str):
        raise PolicyError(f"policy {where}: a policy needs a 'name' string attribute (BasePolicy has one)")
    if name in BUILTIN and type(obj) is not BUILTIN[name]:
        # A subclass of BasePolicy that sets ``name = "mine"`` without @dataclass keeps BasePolicy's field value:
        # its results would be reported under the built-in's name (and beside the built-in's own column).
        raise PolicyError(
            f"policy {where}: {type(obj).__qualname__} is named {name!r}, a built-in policy's name, so reports "
            'would show its results as the built-in\'s; give it its own name: a field `name: str = "..."` in a '
            "@dataclass(frozen=True) subclass of BasePolicy"
        )
    if _inherits_every_hook_of_base(obj):
        # Its results would be torch's defaults reported under its name: a hook spelt otherwise (``decide``,
        # ``on_new_group``) is never called, and nothing said so.
        raise PolicyError(
            f"policy {where}: {type(obj).__qualname__} overrides neither on_init nor on_group, so it would run as "
            "torch's defaults under its own name; override the hook whose answer you change (its signature: "
            "simnccl.policy.BasePolicy), or use the built-in 'torch-default'"
        )
    for hook in ("on_init", "on_group"):
        if not callable(getattr(obj, hook, None)):
            raise PolicyError(f"policy {where}: no {hook}() (subclass simnccl.policy.BasePolicy to get both)")
        if getattr(type(obj), hook, None) is getattr(Policy, hook):  # the Protocol's stub: returns None
            raise PolicyError(
                f"policy {where}: {type(obj).__qualname__}.{hook} is the Policy protocol's stub, which does "
                "nothing; subclass simnccl.policy.BasePolicy (torch's defaults) and override what you change"
            )
    return obj  # type: ignore[return-value]


def _inherits_every_hook_of_base(obj: object) -> bool:
    """A BasePolicy subclass (not BasePolicy itself) whose on_init and on_group are both BasePolicy's own."""
    kind = type(obj)
    if kind is BasePolicy or not isinstance(obj, BasePolicy):
        return False
    own = vars(obj) if hasattr(obj, "__dict__") else {}
    return all(getattr(kind, hook) is getattr(BasePolicy, hook) and hook not in own for hook in ("on_init", "on_group"))


# ---------------------------------------------------------------------- entry points


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


def entry_point_names() -> list[str]:
    """Policy names installed packages register (group ``simnccl.policies``), sorted."""
    return [e.name for e in _entry_points() if _EP_NAME.match(e.name) and e.name not in BUILTIN]


def _entry_point(name: str) -> metadata.EntryPoint | None:
    if not _EP_NAME.match(name):
        return None
    for entry in _entry_points():
        if entry.name == name:
            return entry
    return None


# ---------------------------------------------------------------------- round trip through a file


def describe_policy(policy: str | Policy | None) -> str | dict[str, Any] | None:
    """A JSON-able description that ``policy_from_description`` turns back into an equal policy.

    A spec string stays a string; a built-in object with its default fields becomes its name; a composition
    whose parts all have names becomes ``a+b``; anything else becomes ``{"import": "module:Qualname",
    "fields": {...}, "file": "/path/of/module.py"}`` (a dataclass's fields that differ from their defaults;
    the file lets the replay find a module that was importable only inside the test session, such as a test
    module).
    Raises ``PolicyError`` when the policy cannot be rebuilt from a description (a class defined inside a
    function, fields that are not JSON data, a non-dataclass whose constructor needs arguments).
    """
    if policy is None or isinstance(policy, str):
        return policy
    if isinstance(policy, AsCaptured):
        inner = describe_policy(policy.inner)
        return f"{AS_CAPTURED}{inner})" if isinstance(inner, str) else {"as_captured": inner}
    if isinstance(policy, ComposedPolicy):
        parts = [describe_policy(part) for part in policy.parts]
        if all(isinstance(part, str) for part in parts):
            return "+".join(parts)  # type: ignore[arg-type]
        return {"compose": parts}
    builtin = _builtin_spec(policy)
    if builtin is not None:
        return builtin
    cls = type(policy)
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        raise PolicyError(
            f"policy {getattr(policy, 'name', qualname)!r}: class {qualname} is defined inside a function, so no "
            "other process can rebuild it; define it at module level"
        )
    fields: dict[str, Any] = {}
    if dataclasses.is_dataclass(policy):
        for f in dataclasses.fields(policy):
            value = getattr(policy, f.name)
            if f.init and not (f.default is not dataclasses.MISSING and value == f.default):
                fields[f.name] = value  # only what differs from the class's defaults: the file stays readable
        try:
            json.dumps(fields)
        except (TypeError, ValueError) as error:
            raise PolicyError(f"policy {qualname}: its fields are not JSON data ({error})") from None
    description: dict[str, Any] = {"import": f"{cls.__module__}:{qualname}", "fields": fields}
    source = _module_file(cls)
    if source is not None:
        description["file"] = source
    return description


def _builtin_spec(policy: object) -> str | None:
    cls = type(policy)
    if cls is BudgetPolicy:
        budget: BudgetPolicy = policy  # type: ignore[assignment]
        if budget.name != "budget":
            return None
        per = f",{budget.per_group_mib:g}" if budget.per_group_mib is not None else ""
        text = f"budget({budget.max_mib_per_device:g}{per})"
        return text if get_policy(text) == policy else None
    for name, factory in BUILTIN.items():
        if cls is factory and policy == factory():
            return name
    return None


def _module_file(cls: type) -> str | None:
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path else None


def policy_from_description(description: str | Mapping[str, Any] | None) -> Policy | None:
    """The inverse of ``describe_policy``; ``PolicyError`` when it cannot be rebuilt here."""
    with os_exit_raises(PolicyCalledExit):
        return _policy_from_description(description)


def _policy_from_description(description: str | Mapping[str, Any] | None) -> Policy | None:
    if description is None:
        return None
    if isinstance(description, str):
        return get_policy(description)
    if not isinstance(description, Mapping):
        raise PolicyError(f"policy description: expected a spec string or a table, got {type(description).__name__}")
    if "as_captured" in description:
        inner = _policy_from_description(description["as_captured"])
        if inner is None or isinstance(inner, AsCaptured):
            raise PolicyError("policy description: 'as_captured' must describe one policy, not another as_captured")
        return AsCaptured(inner)
    if "compose" in description:
        parts = description["compose"]
        if not isinstance(parts, list) or not parts or len(parts) > MAX_PARTS:
            raise PolicyError(f"policy description: 'compose' must be a list of 1 to {MAX_PARTS} parts")
        return ComposedPolicy(tuple(_policy_from_description(p) for p in parts))  # type: ignore[misc]
    spec = description.get("import")
    if not isinstance(spec, str) or not _IMPORT_SPEC.match(spec):
        raise PolicyError("policy description: 'import' must be 'package.module:Name'")
    fields = description.get("fields", {})
    if not isinstance(fields, Mapping):
        raise PolicyError("policy description: 'fields' must be a table")
    cls = _import_class(spec, description.get("file"))
    if not inspect.isclass(cls) or not _looks_like_policy(cls):
        raise PolicyError(f"policy description: {spec} is not a policy class")
    try:
        return _checked(cls(**fields), spec)
    except TypeError as error:
        raise PolicyError(f"policy description: {spec}(**{dict(fields)!r}) failed: {error}") from None


def _import_class(spec: str, file: object) -> Any:
    """Import ``module:Qualname``; if the module is not importable here but ``file`` names its source (a test
    module pytest imported from its folder), load it from there under its recorded name."""
    module_name, qualname = spec.split(":", 1)
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError:
        if not isinstance(file, str) or not Path(file).is_file():
            raise PolicyError(
                f"policy {spec}: module {module_name!r} is not importable here (and its file is not recorded); "
                "run from the folder that holds it or install its package"
            ) from None
        module = _load_from_file(module_name, Path(file))
    here = getattr(module, "__file__", None)
    if isinstance(file, str) and Path(file).is_file() and here and Path(here).resolve() != Path(file).resolve():
        # Another project's module of the same name (run from another folder): replaying the case with it judged
        # another policy, and said pass for the one that failed.
        raise PolicyError(
            f"policy {spec}: module {module_name!r} here is {Path(here).resolve()}, not {file}, where the case "
            "was recorded; run from the folder the test ran in, or name the policy with --policy"
        )
    return _attribute(module, module_name, qualname, f"policy {spec}")


def _load_from_file(module_name: str, path: Path) -> Any:
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its sibling imports (a test module's conftest helpers) resolve too
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise PolicyError(f"policy module {module_name!r}: cannot load {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as error:
        del sys.modules[module_name]
        if not policy_raised(error):
            raise
        raise PolicyError(f"policy module {module_name!r} from {path}: import failed: {repr_text(error)}") from None
    return module


def policy_label(policy: str | Policy | None) -> str:
    """A short human name for reports: the spec, or the object's ``name``."""
    if policy is None:
        return BasePolicy().name
    if isinstance(policy, str):
        return policy
    return str(getattr(policy, "name", type(policy).__qualname__))
