"""`make bench`: every CPU figure on this machine (a few minutes)."""

import sys
import time

from bench import checkpoint, efficiency, render, train


def main() -> int:
    t0 = time.perf_counter()
    for title, fn in (
        ("Render time", lambda: render.main(["--runs", "5"])),
        ("Training throughput (CPU)", lambda: train.main([])),
        ("Checkpoint cost (CPU)", lambda: checkpoint.main([])),
        ("Ours against the workshop's approach, one run (CPU)", lambda: efficiency.main([])),
    ):
        print(f"\n== {title} ==", flush=True)
        fn()
    print(f"\nbench: done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
