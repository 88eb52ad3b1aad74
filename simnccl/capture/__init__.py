"""Capture unmodified torch.distributed code into simnccl Programs, one simulated rank at a time.

Why: the framework generators (``simnccl.workloads``) cover the startups we could read; for anything else the
honest source of a Program is what the code really calls. ``capture(fn, world_size)`` runs ``fn`` once per
simulated rank against a ``simnccl`` stand-in backend and records every ``init_process_group``,
``new_group``, ``split_group``, ``destroy_process_group``, ``torch.cuda.set_device``, collective and
point-to-point call, with its arguments, as the ops of ``simnccl.ops``. ``python -m simnccl.capture --world 8
-m module`` (or ``script.py``) does the same for a program and prints a summary, optionally simulating it and
writing a scenario TOML or a JSON programs file.

How each piece works, and why it is done that way (torch 2.15.0, CPU only):

* **The backend.** A Python ``torch._C._distributed_c10d.Backend`` subclass registered through torch's own
  ``Backend.register_backend(name, creator, extended_api=True, devices=["cpu", "cuda"])`` under ``nccl``,
  ``nccl2``, ``nccl-legacy``, ``nccl-lazy``, ``gloo`` and ``fake`` (so ``"cpu:gloo,cuda:nccl"`` maps work
  too), keeping torch's ``BackendType`` for ``nccl`` and ``gloo``. Every collective returns a completed
  Work (``_create_work_from_future``); nothing is communicated, outputs keep valid shapes (all-gathers copy
  the input into every slot, which is what torch's own ``fake`` backend does). It reports
  ``getBackendName()`` as the implementation the emulated release selects (``nccl2`` for ``"nccl"`` on 2.15,
  ``nccl`` under ``TORCH_DIST_USE_NCCL2=0``), because DeviceMesh compares that name. A PyBackend subclass must
  define *every* bool property and ``options``: torch's trampoline otherwise recurses forever.
* **Device binding.** Real 2.15 nccl2 writes the device it picks back to ``bound_device_id`` even without
  ``device_id`` (``_nccl2_device``), and code branches on it (DeviceMesh takes ``split_group`` when the default
  group is bound). The stand-in does the same for the implementations that do it on the emulated release,
  but binds ``cpu:<index>`` (same index): torch creates tensors on the bound device (``barrier``), and there
  is no CUDA here. Limit: ``new_group(device_id=cuda:N)`` then trips torch's "Mismatched bound device".
* **CUDA.** ``torch.cuda.is_available``/``device_count``/``set_device``/``current_device``/``synchronize`` and
  ``torch.accelerator``'s queries are replaced while a rank runs, so ``init_device_mesh("cuda", ...)`` and
  ``device_id=cuda:N`` work; ``set_device`` is recorded. CUDA tensors, ``.to("cuda")``, modules moved to a device,
  CUDA RNG state and seeding (torch's own ``torch.cuda.random`` on one CPU generator per device; Megatron's
  ``model_parallel_cuda_manual_seed``), streams, events and the allocator's statistics run on the CPU without a
  driver call (``fake_devices``: a TorchFunctionMode shows placed tensors as ``cuda:N`` to Python, a
  TorchDispatchMode below autograd places and sizes every storage per device), and the memory they reserve
  becomes ``alloc``/``empty_cache`` ops the simulator charges. Values are real, so capture tiny model configurations.
* **The first training step.** ``capture(startup, world, step=train_step)`` (CLI ``--step MODULE:FUNCTION``)
  calls ``train_step(startup())`` between checkpoints ``startup`` and ``step1``: its forward, backward and
  optimizer tensors and the DDP/FSDP/DTensor collectives it issues are recorded, so lazy communicators pay their
  first use and step 1's peak is simulated; ``memory_check()`` marks a vLLM-style check after it.
* **Rendezvous.** ``env://``, ``tcp://`` and ``file://`` rendezvous yield torch's no-op ``FakeStore`` (the
  store torch's own fake mode uses), so no rank waits for a peer. A store the code builds itself
  (``TCPStore(...)``) is not intercepted: it waits for peers that never come, and the rank times out.
* **Recording.** A non-member's ``new_group`` never reaches any backend, yet every rank's call must be
  recorded, so ``init_process_group``/``new_group``/``split_group``/``destroy_process_group`` are wrapped
  wherever a loaded module holds them (DeviceMesh and user modules bind them at import; ``sys.setprofile``
  would need no patching but made a first DeviceMesh build 20x slower), once per capture, by wrappers that
  record into the running rank's recorder (a module one rank imports records every rank). Collectives are
  recorded by the backend itself, so functional collectives are seen too. A ``new_group`` for a group the rank
  is not in (most calls: Megatron at 512 ranks makes ~2,900 per rank, a few dozen as a member) skips torch's
  path and does only what it leaves behind (``nonmember``; the torch it was checked against only).
* **One rank at a time.** torch's world (``_World``) is process-global, and real code keeps rank state in
  module globals and reads ``LOCAL_RANK`` from ``os.environ``. torch 2.15's ``multi_threaded_pg``
  (``_install_threaded_pg``: a thread-local ``_World``) swaps the world per thread, but not the environment,
  the CUDA current device or the user's globals, so threads cannot give each rank its own process.
  ``mode="fork"`` (default on Linux) forks one child per rank from this process (torch is imported once and
  its lazy imports are paid once, by a throw-away warm-up; a fork then starts in milliseconds), each under a
  timeout, killed and reaped when it overruns. A script or ``-m`` module (``script_target``, the CLI) gets a
  *fork server* (``forkserver``): one forked process imports the script's leading imports once (Megatron-Core:
  ~5 s) and every rank forks from it, then runs the whole script as ``__main__`` with its own environment;
  the preload is refused, and each rank imports for itself, when an import reads ``RANK``/``LOCAL_RANK``/
  ``GROUP_RANK`` (``script``). Each forked rank starts from the same module state, so code that keeps state in
  module globals (Megatron's ``parallel_state``) is captured correctly. ``mode="inline"`` runs the ranks one
  after another in this process (``destroy_process_group`` and the environment are reset between ranks); the
  target must then keep no state of its own between runs — so inline mode cannot capture Megatron (its
  globals persist from one rank to the next): use fork mode, the default wherever ``os.fork`` exists.
* **Cost.** Megatron at 512 ranks makes ~2,900 recorded calls per rank: arguments are bound without
  ``inspect.Signature.bind`` and converted by exact-type fast paths (``intercept``, ``values``); a rank pickles
  its ops, calls and notes apart, as (class, field values); the capturing process merges results as they
  arrive, keeping equal parts once (``ranks._Results``), and ``gc.freeze()`` keeps the collector from copying
  the shared heap into every child; before forking 128 ranks or more, the process they fork from maps its
  memory with huge pages (``heap``: ``fork`` and exit then copy and drop 1/512 of the page-table entries).
  ``CapturedRun.to_json`` lists each distinct call list once, with its ranks. When several ranks fail, the
  error names the lowest of them, however the children's ends interleave.

Options: every ``pg_options`` field torch receives (``ProcessGroupNCCL.Options`` and its ``NCCLConfig``: Megatron's
``cga_cluster_size``/``max_ctas``/``min_ctas``/``net_name``, ``is_high_priority_stream``, ``lazy_init``,
``split_share`` ...) is kept in the op's ``PgOptions`` under torch's name, and in the TOML and JSON written from
it; the fields the simulator does not use yet are named in the run's notes and in the TOML's header.

Group handles: a program refers to groups by handle (``simnccl.ops``). The default group is ``"world"``. Each
group-creation call gets a family handle: consecutive calls with the same ``group_desc`` (else backend) and
disjoint rank sets share one handle, like a framework's ``for ranks in groups: g = new_group(ranks)`` loop
assigning one variable; a call whose ranks overlap the family starts a new one (``mesh_tp.1``,
``mesh_tp.2``...). A rank is a member of at most one group per handle, so a collective's handle always names
the group it ran on, and ranks with the same calls share one Program (DESIGN rule 8).

Variants: a captured Program is one branch of the code, decided by the release, the environment
(``TORCH_DIST_USE_NCCL2``) and the policy it ran under: 2.15's nccl2 binds the default group, so DeviceMesh
takes ``split_group``; legacy and 2.14 leave it unbound, so DeviceMesh loops ``new_group``. The run records
those settings and what they decided (``BranchSettings``: in the summary, the JSON and the TOML's header), and
``simulate``/``--simulate`` under settings that decide differently raise ``BranchMismatch`` saying how to
re-capture, instead of replaying calls real torch would not make. ``capture(..., policy=...)`` runs each rank
under ``simnccl.torch_apply.apply(policy)``, so the Programs hold the policy's decisions (replayed as decided:
``as-captured(policy)``, ``simnccl.policy.as_captured``, never asked of the policy again); the stand-in models
nccl2's ``supportsSplitting`` (a ``lazy_init`` group is no split source until its first collective), so a
lazy-init DeviceMesh over an unused bound default group fails in capture with torch's own error, as on a GPU.

Scaling: a captured Program is what the code did at that world size. "Replay at a larger world" means
capturing the same code again with a larger ``world_size`` (the code is what scales); ``capture_scaled``
does exactly that.

Layout (one concept per module): ``api`` (``capture``/``capture_scaled``), ``result`` (``CapturedRun`` and the
branch settings), ``ranks`` (forked or inline ranks under timeouts), ``forkserver`` (ranks forked from a process
holding a script's imports), ``script`` (a script or module as a target, and what of it may be preloaded),
``environment`` (what a rank runs inside), ``heap`` (the fork source's memory), ``fake_devices`` (CUDA tensors, RNG
and streams on the CPU, sized per device), ``intercept`` (the call wrappers), ``standin`` (the backend),
``recorder``, ``values`` (argument conversion).
"""

from simnccl.capture.api import capture, capture_scaled, main
from simnccl.capture.recorder import UNRECORDED, checkpoint, memory_check
from simnccl.capture.result import (
    NO_POLICY,
    BranchMismatch,
    BranchSettings,
    Call,
    CapturedRun,
    CaptureError,
    RankCapture,
    branch_settings,
    unmodelled_options,
)
from simnccl.capture.script import ScriptTarget, script_target
from simnccl.capture.standin import StandInBackend

__all__ = [
    "NO_POLICY",
    "UNRECORDED",
    "BranchMismatch",
    "BranchSettings",
    "Call",
    "CaptureError",
    "CapturedRun",
    "RankCapture",
    "ScriptTarget",
    "StandInBackend",
    "branch_settings",
    "capture",
    "capture_scaled",
    "checkpoint",
    "main",
    "memory_check",
    "script_target",
    "unmodelled_options",
]
