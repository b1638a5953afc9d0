"""Every NATS subject, stream, bucket, queue group and header name loopwire uses.

Nothing else in the code base spells these; build them from a :class:`Names` (the prefix comes
from ``LW_PREFIX``, default ``lw``, so several deployments can share one NATS server).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final, Literal, get_args

# Loop API verbs (binding).
Verb = Literal["start", "input", "interrupt", "answer", "close", "fork", "budget"]
VERBS: Final[tuple[Verb, ...]] = get_args(Verb)

# Queue groups.
COMMITTER_QUEUE: Final = "committer"

# Headers on tool calls (binding, design section 6).
H_LOOP_ID: Final = "Lw-Loop-Id"
H_TURN_ID: Final = "Lw-Turn-Id"
H_STEP_ID: Final = "Lw-Step-Id"
H_TOOL_USE_ID: Final = "Lw-Tool-Use-Id"
H_EXECUTION_ID: Final = "Lw-Execution-Id"
H_IDEMPOTENCY_KEY: Final = "Lw-Idempotency-Key"
H_DEADLINE: Final = "Lw-Deadline"
# Unix ms after which a worker must not start the call: the caller's lease ends then.
H_START_BY: Final = "Lw-Start-By"
# "1": the caller knows no earlier attempt of this execution id exists (the first send of a step
# planned just now), so the worker may skip reading the call's record.
H_FIRST_SEND: Final = "Lw-First-Send"
# "1": the caller will never read this call's record — its step wrote no plan (read-only calls only),
# so running the step again asks the model again — so a read-only tool writes no `done` record.
H_NO_RECORD: Final = "Lw-No-Record"
H_TRACEPARENT: Final = "traceparent"
# Tool replies: "progress" (heartbeat) or "result"; a worker error carries "error".
H_REPLY_KIND: Final = "Lw-Reply"
H_WORKER_ID: Final = "Lw-Worker-Id"

# Headers of a history record: its place in the loop's digest chain (see shared.chain).
H_DIGEST: Final = "Lw-Digest"
H_DIGEST_PREV: Final = "Lw-Digest-Prev"
H_CHAIN_INDEX: Final = "Lw-Chain-Index"

# JetStream headers.
H_MSG_ID: Final = "Nats-Msg-Id"
H_EXPECTED_LAST_SUBJECT_SEQ: Final = "Nats-Expected-Last-Subject-Sequence"
H_EXPECTED_STREAM: Final = "Nats-Expected-Stream"
H_BATCH_ID: Final = "Nats-Batch-Id"
H_BATCH_SEQ: Final = "Nats-Batch-Sequence"
H_BATCH_COMMIT: Final = "Nats-Batch-Commit"
H_SEQUENCE: Final = "Nats-Sequence"
H_SUBJECT: Final = "Nats-Subject"
H_NUM_PENDING: Final = "Nats-Num-Pending"
H_LAST_SEQUENCE: Final = "Nats-Last-Sequence"
H_TIMESTAMP: Final = "Nats-Time-Stamp"  # when the server stored the message (RFC 3339, UTC, nanoseconds)
H_STATUS: Final = "Status"


# The JetStream API's own subjects (NATS' names, not loopwire's; no JetStream domain support needed).
JS_API: Final = "$JS.API"


def js_api(operation: str, stream: str) -> str:
    """e.g. ``js_api("DIRECT.GET", "LW_HISTORY")`` → ``$JS.API.DIRECT.GET.LW_HISTORY``."""
    return f"{JS_API}.{operation}.{stream}"


def kv_stream(bucket: str) -> str:
    """The stream behind a KV bucket (nats-py's naming)."""
    return f"KV_{bucket}"


@dataclass(frozen=True, slots=True)
class Names:
    """Subjects, streams and buckets for one deployment prefix and shard count.

    With ``shards`` > 1 each loop belongs to shard :meth:`shard_of` and the history and work
    streams and the leases and results buckets exist once per shard. Shard 0 keeps the one-shard
    names (``LW_HISTORY``, ``lw.hist.<loop>``, ...), so a deployment that grows from one shard keeps
    its streams; shard k >= 1 adds ``_<k>`` to them (``LW_HISTORY_2``, ``lw.hist_2.<loop>``).
    The one-shard accessors (``history_stream``, ``hist()``, ...) are for one-shard deployments only.
    """

    prefix: str = "lw"
    shards: int = 1

    # --- shards
    def shard_of(self, loop_id: str) -> int:
        """The loop's shard: a stable hash of its id (CRC-32), the same in every process and release."""
        if self.shards == 1:
            return 0
        return zlib.crc32(loop_id.encode()) % self.shards

    @property
    def shard_ids(self) -> range:
        return range(self.shards)

    def _one(self) -> None:
        assert self.shards == 1, "a sharded deployment names each shard's stream: use the *_of(shard) forms"

    @staticmethod
    def _k(shard: int) -> str:
        return f"_{shard}" if shard else ""

    # --- streams and buckets
    def history_stream_of(self, shard: int) -> str:
        return f"{self.prefix.upper()}_HISTORY{self._k(shard)}"

    def work_stream_of(self, shard: int) -> str:
        return f"{self.prefix.upper()}_WORK{self._k(shard)}"

    def leases_bucket_of(self, shard: int) -> str:
        return f"{self.prefix}_leases{self._k(shard)}"

    def results_bucket_of(self, shard: int) -> str:
        """Step plans (``step.<step_id>``) and tool-call records (``tool.<tool>.<execution_id>``)."""
        return f"{self.prefix}_results{self._k(shard)}"

    @property
    def history_stream(self) -> str:
        self._one()
        return self.history_stream_of(0)

    @property
    def work_stream(self) -> str:
        self._one()
        return self.work_stream_of(0)

    @property
    def leases_bucket(self) -> str:
        self._one()
        return self.leases_bucket_of(0)

    @property
    def results_bucket(self) -> str:
        self._one()
        return self.results_bucket_of(0)

    @property
    def tools_bucket(self) -> str:
        return f"{self.prefix}_tools"

    @property
    def memory_bucket(self) -> str:
        return f"{self.prefix}_memory"

    # --- history
    def hist_in(self, shard: int, loop_id: str) -> str:
        """The loop's history subject in ``shard``'s stream (see :func:`shared.shards.home_of`)."""
        return f"{self.prefix}.hist{self._k(shard)}.{loop_id}"

    def hist_all_of(self, shard: int) -> str:
        return f"{self.prefix}.hist{self._k(shard)}.>"

    def hist(self, loop_id: str) -> str:
        self._one()
        return self.hist_in(0, loop_id)

    @property
    def hist_all(self) -> str:
        self._one()
        return self.hist_all_of(0)

    @staticmethod
    def loop_of_hist(subject: str) -> str:
        """The loop of a history subject of any shard."""
        return subject.rsplit(".", 1)[-1]

    def ctl(self, loop_id: str) -> str:
        """The loop API's records, republished by the committer after it stored them (core NATS).

        The model-step driving a loop listens here, not on the loop's history subject: it must
        learn at once of what others write (an interrupt, a close, an input, an answer), while its
        own steps, most of the history, it knows already.
        """
        return f"{self.prefix}.ctl.{loop_id}"

    def of_loop(self, loop_id: str) -> str:
        """Every single-token-kind subject of one loop (history, control, live, commit, work): one
        subscription sees them in the order the server sent them, which separate ones do not."""
        return f"{self.prefix}.*.{loop_id}"

    # --- live ephemeral events
    def live(self, loop_id: str) -> str:
        """A loop's live frames: each a JSON array of its ephemeral events (``shared.codec.decode_live_frame``)."""
        return f"{self.prefix}.live.{loop_id}"

    @property
    def live_all(self) -> str:
        return f"{self.prefix}.live.*"

    # --- committer
    def commit(self, loop_id: str) -> str:
        return f"{self.prefix}.commit.{loop_id}"

    @property
    def commit_all(self) -> str:
        return f"{self.prefix}.commit.*"

    def chain_tip(self, loop_id: str) -> str:
        """A loop's newest stored chain link, told by the committer that stored it to the others
        (core NATS, ``<seq> <index> <digest>``), so the next append, whichever committer takes it,
        needs no read of the record it follows."""
        return f"{self.prefix}.chain.{loop_id}"

    @property
    def chain_tip_all(self) -> str:
        return f"{self.prefix}.chain.*"

    def api(self, loop_id: str, verb: Verb) -> str:
        return f"{self.prefix}.api.{loop_id}.{verb}"

    @property
    def api_all(self) -> str:
        return f"{self.prefix}.api.*.*"

    # --- work signal
    def work(self, loop_id: str) -> str:
        """The loop's work subject, in its shard's work stream."""
        return f"{self.prefix}.work{self._k(self.shard_of(loop_id))}.{loop_id}"

    def work_all_of(self, shard: int) -> str:
        return f"{self.prefix}.work{self._k(shard)}.>"

    @property
    def work_all(self) -> str:
        self._one()
        return self.work_all_of(0)

    @staticmethod
    def loop_of_work(subject: str) -> str:
        """The loop of a work subject of any shard."""
        return subject.rsplit(".", 1)[-1]

    @property
    def work_consumer(self) -> str:
        return f"{self.prefix}_model_step"

    def tool_worker(self, worker_id: str) -> str:
        """A tool worker's liveness subject: no responders there means the process is gone."""
        return f"{self.prefix}.toolalive.{worker_id}"

    @property
    def presence(self) -> str:
        """Every running service answers a request here with its name and shard count (core NATS):
        how ``loopwire shards grow`` knows none runs (``shared.layout``)."""
        return f"{self.prefix}.services"

    def lease_holder(self, token: str) -> str:
        """A model-step replica's liveness subject: no responders there means its leases may be taken."""
        return f"{self.prefix}.msalive.{token}"

    # --- tools
    def tool(self, name: str) -> str:
        return f"{self.prefix}.tool.{name}"

    def tool_queue(self, name: str) -> str:
        return f"tool_{name}"

    def toolctl(self, execution_id: str) -> str:
        return f"{self.prefix}.toolctl.{execution_id}"


DEFAULT_NAMES: Final = Names()
