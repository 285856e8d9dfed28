"""All-reduce bandwidth check: run before big jobs, fail when the fabric is below its pass mark.

A torch equivalent of nccl-tests' ``all_reduce_perf`` under torchrun: NCCL on GPU (over EFA
when the job gets EFA devices), gloo on CPU. For each message size from ``--min-bytes`` to
``--max-bytes`` (multiplied by ``--factor``) it checks one all-reduce's result, runs
``--warmup`` untimed iterations, then times ``--iters`` in-place all-reduces (the GPU stream
synchronised before the clock stops) and reports nccl-tests' figures (NVIDIA/nccl-tests
doc/PERFORMANCE.md and src/all_reduce.cu ``AllReduceGetBw``, v2.19.6):

* ``algbw = bytes / time`` in GB/s of 1e9 bytes;
* ``busbw = algbw * 2 * (n - 1) / n`` for n ranks, the figure comparable with the hardware's
  link bandwidth whatever the rank count;
* the time is the average over the ranks of each rank's mean iteration time (nccl-tests'
  default ``-a 1``).

Rank 0 prints one line per size and, at the end, one machine-readable ``TRAINING_EVENT``
``result`` line with ``busbw_gbps`` (at the largest size: the plateau the fabric reaches),
``algbw_gbps``, the average busbw over the sizes (nccl-tests' "Avg bus bandwidth"), the pass
mark and whether it passed.

Below ``--min-busbw-gbps`` every rank exits 3 (``trainlib.EXIT_BAD_CONFIG``), which the
runtimes fail at once instead of restarting: a restart lands on the same nodes, placement
group and fabric (training nodes are never disrupted), so it would measure the same figure and
only burn ``maxRestarts`` attempts of the most expensive nodes. A wrong all-reduce result also
exits 3. Bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import re
import time

import torch
import torch.distributed as dist
import trainlib

_SIZE = re.compile(r"^(\d+)([KMG]?)$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # nccl-tests' -b/-e suffixes are powers of 1024
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_size(text: str) -> int:
    """``8``, ``4K``, ``1M``, ``8G`` -> bytes."""
    m = _SIZE.match(text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 1048576, 64K, 1M or 8G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def bandwidths(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) of an all-reduce of ``size_bytes`` that took ``seconds``
    across ``world_size`` ranks."""
    algbw = size_bytes / 1e9 / seconds
    return algbw, algbw * 2 * (world_size - 1) / world_size


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1M"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("8G"), help="the pass mark is checked at this size")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--min-busbw-gbps", type=float, required=True, help="pass mark: busbw (GB/s) at --max-bytes")
    args = trainlib.parse_args(p, argv)
    elem = torch.tensor([], dtype=DTYPES[args.dtype]).element_size()
    if args.factor < 2:
        trainlib.usage_error(p, "--factor must be >= 2")
    if args.iters < 1 or args.warmup < 0:
        trainlib.usage_error(p, "--iters must be >= 1 and --warmup >= 0")
    if args.min_bytes < elem or args.min_bytes > args.max_bytes:
        trainlib.usage_error(p, f"need {elem} <= --min-bytes <= --max-bytes")
    if args.min_busbw_gbps < 0:
        trainlib.usage_error(p, "--min-busbw-gbps must be >= 0")
    return args


def _sync(d: trainlib.Dist) -> None:
    if d.device.type == "cuda":
        torch.cuda.synchronize(d.device)


def measure(buf: torch.Tensor, size_bytes: int, d: trainlib.Dist, warmup: int, iters: int) -> float:
    """Mean seconds per all-reduce of the first ``size_bytes`` of ``buf``, averaged over the ranks;
    checks the result of one all-reduce first (every rank adds 1: the sum is the world size,
    exact in float32; bfloat16/float16 sums of many ranks may round)."""
    t = buf[: size_bytes // buf.element_size()]
    t.fill_(1)
    dist.all_reduce(t)
    expected = float(d.world_size)
    tolerance = 0.0 if t.dtype == torch.float32 else expected * 2 ** -7
    wrong = int(((t.float() - expected).abs() > tolerance).sum().item())
    if wrong:
        trainlib.fail_config(f"all-reduce of {size_bytes} bytes: {wrong} elements differ from {expected} on rank {d.rank}")
    t.zero_()  # timed iterations add zeros: no overflow however many iterations
    for _ in range(warmup):
        dist.all_reduce(t)
    _sync(d)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    _sync(d)
    seconds = (time.perf_counter() - start) / iters
    return trainlib.all_reduce_sum([seconds], d.device)[0] / d.world_size


def main(argv=None) -> int:
    args = parse_args(argv)
    d = trainlib.setup()
    if d.world_size < 2:
        trainlib.fail_config(f"an all-reduce check needs at least 2 ranks (world size {d.world_size})")
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    plan = [s - s % elem for s in sizes(args.min_bytes, args.max_bytes, args.factor)]
    buf = torch.empty(plan[-1] // elem, dtype=dtype, device=d.device)
    backend = dist.get_backend() if dist.is_initialized() else "none"
    trainlib.log(d, f"all-reduce check: {d.world_size} ranks, backend {backend}, {args.dtype}, {plan[0]}..{plan[-1]} bytes, {args.warmup} warm-up + {args.iters} timed iterations")
    trainlib.log(d, f"{'size (B)':>14} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
    rows = []
    for size in plan:
        seconds = measure(buf, size, d, args.warmup, args.iters)
        algbw, busbw = bandwidths(size, seconds, d.world_size)
        rows.append((size, seconds, algbw, busbw))
        trainlib.log(d, f"{size:>14} {seconds * 1e6:>12.1f} {algbw:>13.2f} {busbw:>13.2f}")
    size, seconds, algbw, busbw = rows[-1]
    avg_busbw = sum(r[3] for r in rows) / len(rows)
    passed = busbw >= args.min_busbw_gbps
    trainlib.event(
        d, "result", busbw_gbps=round(busbw, 3), algbw_gbps=round(algbw, 3), size_bytes=size, time_us=round(seconds * 1e6, 1),
        avg_busbw_gbps=round(avg_busbw, 3), min_busbw_gbps=args.min_busbw_gbps, world_size=d.world_size, backend=backend, passed=passed,
    )
    if not passed:  # every rank has the same averaged figure, so every rank stops the same way
        trainlib.fail_config(f"all-reduce bus bandwidth {busbw:.2f} GB/s at {size} bytes is below the pass mark {args.min_busbw_gbps:g} GB/s")
    trainlib.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
