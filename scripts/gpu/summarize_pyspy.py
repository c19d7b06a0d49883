"""Where a process's samples went, from py-spy's collapsed stacks (scripts/gpu/gpu_tune.py, TUNE_PROFILE=1).

usage: python scripts/gpu/summarize_pyspy.py FILE [FILE ...] [--top 25]

For each file (one process, sampled at a known rate, `--threads`): the samples per thread, and per thread the
functions that held the most samples, self (the innermost frame) and inclusive (anywhere on the stack, each function
counted once per sample). py-spy leaves out idle samples unless asked, so a thread's samples over the rate and the
duration is the share of a core it kept busy.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short(frame: str) -> str:
    """`func (path/to/module.py:123)` -> `func (module.py)`: one entry per function, whatever its line."""
    m = FRAME.match(frame.strip())
    return f"{m['func']} ({Path(m['file']).name})" if m else frame.strip()


def summarize(path: Path, top: int) -> str:
    threads: Counter[str] = Counter()
    selfs: dict[str, Counter[str]] = {}
    inclusive: dict[str, Counter[str]] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread, calls = frames[0], [short(f) for f in frames[1:]]
        threads[thread] += int(count)
        if calls:
            selfs.setdefault(thread, Counter())[calls[-1]] += int(count)
            for call in set(calls):
                inclusive.setdefault(thread, Counter())[call] += int(count)
    total = sum(threads.values())
    out = [f"## {path.name}: {total} samples"]
    for thread, n in threads.most_common():
        out.append(f"\n### {thread}: {n} samples ({100 * n / max(total, 1):.0f} % of the process's)")
        out.append("| self | samples | | inclusive | samples |\n|---|---|---|---|---|")
        own = selfs.get(thread, Counter()).most_common(top)
        under = inclusive.get(thread, Counter()).most_common(top)
        for i in range(max(len(own), len(under))):
            a = own[i] if i < len(own) else ("", 0)
            b = under[i] if i < len(under) else ("", 0)
            out.append(f"| {a[0]} | {a[1] or ''} | | {b[0]} | {b[1] or ''} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print("\n\n".join(summarize(path, args.top) for path in args.files))


if __name__ == "__main__":
    main()
