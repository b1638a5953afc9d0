"""The examples at the end of each command's ``--help``: command lines a user can copy (a test parses
every one with the parser, so they stay true)."""

from __future__ import annotations

from typing import Final

# command (as typed after "loopwire") → (example command line, what it does)
EXAMPLES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "demo": (
        ("loopwire demo", "the default prompt, shown live"),
        ('loopwire demo "what is 2**10?" --plain', "your prompt, as plain lines"),
        ("loopwire demo --tools calculator,clock --data-dir ./demo-data", "two tools; keep the data and logs"),
    ),
    "up": (
        ("loopwire up", "NATS on 4222 (or a free port), every service, the console on 8080"),
        ("loopwire up --port 0 --no-console --model openai:gpt-4o-mini", "a free port, no console, a real model"),
    ),
    "serve": (
        ("loopwire serve committer", "the only writer of history"),
        ("loopwire serve model-step", "drives loops"),
        ("loopwire serve tool calculator clock", "two built-in tools"),
    ),
    "serve committer": (("LW_REPLICAS=3 loopwire serve committer", "streams and buckets with 3 replicas"),),
    "serve model-step": (("LW_MODEL_STEP_CONCURRENCY=32 loopwire serve model-step", "drive 32 loops at once"),),
    "serve tool": (
        ("loopwire serve tool calculator clock", "built-in tools"),
        ("loopwire serve tool examples.add_a_tool:shout", "your own tool (module:attr)"),
    ),
    "serve mcp": (
        ("loopwire serve mcp time -- mcp-server-time --local-timezone=UTC", "a stdio server, run as a child"),
        ("loopwire serve mcp web --url http://127.0.0.1:3001/mcp --header-env Authorization=MCP_AUTH", "over HTTP"),
    ),
    "serve agent": (
        (
            "loopwire serve agent researcher --model demo --tools calculator --instructions prompt.txt",
            "tool researcher: each call runs a child loop",
        ),
    ),
    "console": (
        ("loopwire console", "http://127.0.0.1:8080/"),
        ("LW_CONSOLE_TOKEN=secret loopwire console --host 0.0.0.0 --port 9000", "off loopback, with a token"),
    ),
    "start": (
        ("LOOP=$(loopwire start)", "a loop on the default model, with every live tool"),
        ("loopwire start --model openai:gpt-4o --tools calculator,clock --policy calculator=ask", "ask first"),
        ("loopwire start --max-cost-usd 0.50 --max-steps-per-turn 10 --on-budget ask", "with a budget"),
    ),
    "budget": (
        ("loopwire budget $LOOP", "the budget and what is spent"),
        ("loopwire budget $LOOP --max-total-tokens 200000 --on-budget ask", "change it from the next step on"),
    ),
    "send": (
        ('loopwire send $LOOP "what is 17*23?" --wait', "wait for the turn and print the answer"),
        ("loopwire send $LOOP - < question.txt", "the text from standard input"),
    ),
    "history": (
        ("loopwire history $LOOP", "the committed events, as a table"),
        ("loopwire history 8a3a --json --from 5", "by a unique start of the id; JSON from sequence 5"),
    ),
    "tail": (
        ("loopwire tail", "every loop, from now on"),
        ("loopwire tail $LOOP --no-tokens", "one loop: its history so far, then live, without tokens"),
    ),
    "loops": (
        ("loopwire loops", "every loop, the most recently active first"),
        ("loopwire loops --json", "one JSON object per loop"),
    ),
    "gates": (
        ("loopwire gates", "every open gate"),
        ("loopwire gates $LOOP --json", "one loop's (and its sub-agents') gates, as JSON"),
    ),
    "approve": (
        ("loopwire approve 8a3a84a0", "a gate, by the id the tables show"),
        ("loopwire approve 8a3a84a0 --always", "and allow that tool for the rest of the loop"),
    ),
    "deny": (('loopwire deny 8a3a84a0 --reason "not on a Friday"', "the model reads the reason"),),
    "reply": (('loopwire reply 8a3a84a0 "blue"', "answer an ask_user question"),),
    "interrupt": (("loopwire interrupt $LOOP", "end the running turn"),),
    "close": (("loopwire close $LOOP", "no more input"),),
    "fork": (
        ('loopwire fork $LOOP --at 4 --input "shorter, please"', "retry from sequence 4 with another input"),
        ("loopwire fork $LOOP --model openai:gpt-4o --reexecute kv_memory=reuse", "continue elsewhere"),
    ),
    "lineage": (("loopwire lineage $LOOP", "the loop's tree of forks and child loops"),),
    "diff": (("loopwire diff $LOOP $NEW", "common prefix, first divergence, both branches"),),
    "tools": (
        ("loopwire tools", "live tools: replicas, kind, version, arguments"),
        ("loopwire tools --json", "with each tool's argument schema"),
    ),
    "streams": (
        ("loopwire streams", "each shard's streams and buckets: leader, followers, messages"),
        ("loopwire streams --balance", "spread the leaders over the nodes first"),
    ),
    "shards": (
        ("loopwire shards", "the deployment's shard count and how many services run"),
        ("loopwire shards grow 3", "grow a one-shard deployment to 3 shards, its services stopped"),
    ),
    "auth-config": (("loopwire auth-config --shards 3", "the NATS users and permissions for 3 shards, on stdout"),),
    "verify": (
        ("loopwire verify 3f2a", "one loop's digest chain, from its first record"),
        ("loopwire verify --all --json", "every loop of every shard, as JSON"),
    ),
    "schema": (
        ("loopwire schema --out schemas --asyncapi docs/asyncapi.yaml", "write the contract files"),
        ("loopwire schema --out schemas --asyncapi docs/asyncapi.yaml --check", "exit 1 if they drifted"),
    ),
}


def epilog(command: str) -> str:
    """The examples section of ``command``'s help (``""`` for a command without examples)."""
    examples = EXAMPLES.get(command, ())
    if not examples:
        return ""
    return "examples:\n" + "\n".join(f"  # {what}\n  {line}" for line, what in examples)
