"""The long fuzz campaign: ``python -m tests.fuzz.run --cases 10000`` (cases per boundary).

Starts a nats-server and the services (tests/fuzz/env.py), runs every boundary (or those named with
``--boundary``), prints a table and writes JSON (``--out``, default bench/results/fuzz.json). Exit
status 1 when any case crashed, hung, got an unstructured reply or changed the history stream while
being rejected. ``--seed`` makes the run reproducible (same seed, same versions: same cases).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.fuzz.env import Stats, fuzz_env, run_boundary
from tests.fuzz.gen import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]


def table(stats: list[Stats]) -> str:
    head = ("boundary", "cases", "accepted", "rejected", "crashes", "hangs", "unstructured", "stream writes", "s")
    rows = [
        (
            s.boundary,
            str(s.cases),
            str(s.accepted),
            str(sum(s.rejected.values())),
            str(s.crash),
            str(s.hang),
            str(s.unstructured),
            str(s.stream_write),
            f"{s.seconds:.0f}",
        )
        for s in stats
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases per boundary (default 10000)")
    ap.add_argument("--boundary", action="append", choices=sorted(STRATEGIES), help="only these (repeatable)")
    ap.add_argument("--seed", type=int, default=1, help="hypothesis seed (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz.json", help="JSON report path")
    ap.add_argument("--logs", type=Path, default=None, help="service logs directory (default: a temp dir)")
    args = ap.parse_args(argv)
    boundaries = args.boundary or ["commit", "api", "tool", "codec"]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="lw-fuzz-"))
    results: list[Stats] = []
    t0 = time.monotonic()
    with fuzz_env(logs) as env:
        print(f"corpus: {len(env.corpus.envelopes)} records, {len(env.corpus.live)} live events; logs in {logs}")
        for b in boundaries:
            s = run_boundary(env, b, args.cases, derandomize=False, seed=args.seed)
            results.append(s)
            print(
                f"{b}: {s.cases} cases in {s.seconds:.0f}s, {s.failures} failures; rejected {dict(s.rejected)}",
                flush=True,
            )
            for ex in s.examples:
                print("   ", ex)
            if s.harness_error:
                print("    harness error:", s.harness_error)
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": "python -m tests.fuzz.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cases_per_boundary": args.cases,
        "seed": args.seed,
        "wall_seconds": round(time.monotonic() - t0, 1),
        "boundaries": [s.as_dict() for s in results],
    }
    args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"written: {args.out}")
    return 1 if any(s.failures for s in results) else 0


if __name__ == "__main__":
    sys.exit(main())
