"""Measure gloo's all_reduce, send/recv and bootstrap times on this host and fit the simulator's gloo timing figures.

Run (imports torch; a few minutes on 2 cores, nothing else running)::

    python real/measure_gloo.py [--worlds 2,4] [--repeats 5] [--max-mib 256]

Why: the simulator used to time a gloo collective at the GPU profile's NVLink bandwidth (hundreds of GB/s). A 2
GiB gloo all_reduce then took 5 ms simulated against seconds on a real host, and a short group timeout that real
gloo hits passed in the simulator: a false pass. gloo's pace is the host's (its cores, its TCP stack, its NIC),
not the GPU's, so it gets figures of its own, measured here and written to ``simnccl/data/gloo_transport.toml``
with this command as their source.

What it does: for each world size, that many processes on TCP loopback (``init_process_group("gloo")``, a
``TCPStore`` on 127.0.0.1) run, per message size, one warm-up and ``--repeats`` timed float32 all_reduces, each
between barriers, and as many sends from rank 0 to rank 1 (timed on the receiver). A size's time is the median
over the repeats of the slowest rank's time (all_reduce) or the receiver's (recv).

The fit, the same model the simulator evaluates:

* ``collective_latency_s``: the median all_reduce time of the smallest message (4 bytes) over the worlds;
* ``bus_bandwidth_gbps``: ring bus bytes ``2 (n - 1) / n x size`` over ``(time - latency)``, least squares
  through the origin over every message of at least 1 MiB of every world;
* ``p2p_latency_s`` and ``p2p_bandwidth_gbps``: the same for the send/recv;
* ``bootstrap_per_peer_s``: a ``new_group(backend="gloo")`` of the whole world, ``--repeats`` times after one
  warm-up (the slowest rank's wall time, median), least squares through the origin against ``world - 1``: gloo's
  full mesh connects each rank to every peer.

Every size's measured time, the model's and the error are printed, so the reader sees where the two lines fit and
where they do not. The last lines are the data file's ``[gloo]`` values.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence

SMALLEST = 4
MIB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sizes(max_mib: int) -> list[int]:
    sizes = [SMALLEST, 64 * 1024]
    mib = 1
    while mib <= max_mib:
        sizes.append(mib * MIB)
        mib *= 4
    return sizes


def _rank_main(rank: int, world: int, port: int, sizes: Sequence[int], repeats: int, out: object) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows: list[tuple[str, int, float]] = []
    for size in sizes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32)
        for kind in ("all_reduce", "p2p"):
            times: list[float] = []
            for i in range(repeats + 1):
                dist.barrier()
                start = time.perf_counter()
                if kind == "all_reduce":
                    dist.all_reduce(tensor)
                elif rank == 0:
                    dist.send(tensor, dst=1)
                elif rank == 1:
                    dist.recv(tensor, src=0)
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                if kind == "all_reduce":
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                else:
                    dist.broadcast(elapsed, src=1)
                if i:  # the first is the warm-up (a first all_reduce of a size connects and allocates)
                    times.append(float(elapsed.item()))
            rows.append((kind, size, statistics.median(times)))
    times = []
    for i in range(repeats + 1):  # a gloo communicator's bootstrap: every rank connects to every other
        dist.barrier()
        start = time.perf_counter()
        dist.new_group(list(range(world)), backend="gloo")
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i:
            times.append(float(elapsed.item()))
    rows.append(("bootstrap", 0, statistics.median(times)))
    if rank == 0:
        out.put(rows)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def measure(world: int, sizes: Sequence[int], repeats: int, timeout_s: float) -> list[tuple[str, int, float]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, sizes, repeats, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        rows = queue.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return rows


def _bus_bytes(kind: str, world: int, size: int) -> float:
    return 2 * (world - 1) / world * size if kind == "all_reduce" else float(size)


def fit(results: dict[int, list[tuple[str, int, float]]], kind: str) -> tuple[float, float]:
    """(latency seconds, bandwidth GB/s) of ``kind`` over every world (the model in the module docstring)."""
    latency = statistics.median(t for rows in results.values() for k, s, t in rows if k == kind and s == SMALLEST)
    xs: list[float] = []
    ys: list[float] = []
    for world, rows in results.items():
        for k, size, seconds in rows:
            if k == kind and size >= MIB:
                xs.append(_bus_bytes(kind, world, size))
                ys.append(max(seconds - latency, 1e-12))
    seconds_per_byte = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return latency, 1.0 / seconds_per_byte / 1e9


def fit_bootstrap(results: dict[int, list[tuple[str, int, float]]]) -> float:
    """Seconds per peer of a gloo bootstrap: least squares through the origin of the slowest rank's
    ``new_group`` time against its peers (``world - 1``: gloo connects every pair)."""
    points = [(world - 1, t) for world, rows in results.items() for k, _, t in rows if k == "bootstrap"]
    return sum(p * t for p, t in points) / sum(p * p for p, _ in points)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4", help="world sizes, comma-separated (each at least 2)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per size (median taken)")
    parser.add_argument("--max-mib", type=int, default=256, help="the largest message, MiB")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a world may take in all")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    if any(w < 2 for w in worlds) or args.repeats < 1 or args.max_mib < 1:
        print("measure_gloo: --worlds must each be >= 2, --repeats and --max-mib >= 1", file=sys.stderr)
        return 2
    sizes = _sizes(args.max_mib)
    results = {w: measure(w, sizes, args.repeats, args.timeout) for w in worlds}
    figures = {kind: fit(results, kind) for kind in ("all_reduce", "p2p")}
    print(f"{'world':>5} {'op':>10} {'bytes':>11} {'measured_s':>11} {'model_s':>11} {'error':>7}")
    per_peer = fit_bootstrap(results)
    for world, rows in results.items():
        for kind, size, seconds in rows:
            if kind == "bootstrap":
                model = per_peer * (world - 1)
                print(f"{world:>5} {kind:>10} {'-':>11} {seconds:>11.6f} {model:>11.6f} {model / seconds - 1:>+7.1%}")
                continue
            latency, gbps = figures[kind]
            model = latency + _bus_bytes(kind, world, size) / (gbps * 1e9)
            print(f"{world:>5} {kind:>10} {size:>11,} {seconds:>11.6f} {model:>11.6f} {model / seconds - 1:>+7.1%}")
    (c_lat, c_bw), (p_lat, p_bw) = figures["all_reduce"], figures["p2p"]
    print(f"collective_latency_s = {c_lat:.3g}")
    print(f"bus_bandwidth_gbps = {c_bw:.3g}")
    print(f"p2p_latency_s = {p_lat:.3g}")
    print(f"p2p_bandwidth_gbps = {p_bw:.3g}")
    print(f"bootstrap_per_peer_s = {per_peer:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
