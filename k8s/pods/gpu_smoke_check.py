"""GPU smoke check: run on one gpu-pool node at deploy time (the smoke-check Job's ConfigMap).

After ``nvidia-smi`` (driver and device visible in the container), this multiplies two random
matrices on the GPU and compares the product with the same product on the CPU: the CUDA runtime,
PyTorch's CUDA build and the device all work. It prints one JSON line and exits 0 on success, 1
otherwise (the Job fails, and ``pulumi up`` with it).
"""

from __future__ import annotations

import json
import sys
import time

N = 1024
TOLERANCE = 1e-3  # relative (Frobenius) error; TF32 matmuls stay well inside it


def check(size: int = N) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"ok": False, "error": "no CUDA device visible to PyTorch", "torch": torch.__version__, "cuda": torch.version.cuda}
    gen = torch.Generator().manual_seed(0)
    a, b = torch.rand(size, size, generator=gen), torch.rand(size, size, generator=gen)
    expected = a @ b
    device = torch.device("cuda", 0)
    t0 = time.perf_counter()
    got = (a.to(device) @ b.to(device)).cpu()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    error = float(torch.linalg.norm(got - expected) / torch.linalg.norm(expected))
    return {
        "ok": error < TOLERANCE,
        "device": torch.cuda.get_device_name(device),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "matmul": size,
        "relative_error": error,
        "seconds": round(seconds, 4),
    }


def main() -> int:
    result = check()
    print(json.dumps({"gpu_smoke_check": result}, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
