"""loopwire benchmarks (``pip install -e ".[bench]"``; not run by CI).

    python -m bench floor|step|throughput|replay|peers|commit|all [--quick]

* ``floor`` — the raw message pattern of one tool step with nats-py alone (R1; ``all`` adds R3);
* ``step`` — one loop, instant scripted model, one calculator call per step: per-step latency;
* ``throughput`` — 64 and 256 concurrent loops, 1 and 2 replicas of every service: steps/s,
  CPU per step per process, a py-spy profile;
* ``replay`` — 100 / 1,000 / 10,000-step loops: replay and load rate, bytes per step, commit
  latency at step 10 vs step 10,000;
* ``peers`` — the same workload on LangGraph (Postgres checkpointer), DBOS (Postgres), Restate
  (npm server + Python SDK) and loopwire R1 / R3;
* ``commit`` — the committer's own latency bench (``bench/commit_latency.py``).

``python -m bench.durability`` compares JetStream's ``sync_interval: always`` with the default
fsync policy on the many-loops workload and the 64-loop commit run (steps/s, commit p50, ratios).

Each prints its tables and writes JSON under ``bench/results/``; ``all`` also writes the plot and
ends with the targets table (``bench/targets.py``: MET, MISS or not measured, from that run only).
Peers whose packages are missing, and the plot without matplotlib, are skipped with the reason.
See docs/benchmarks.md for the figures and how to read them.
"""
