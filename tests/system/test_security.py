"""Security: the deployment's NATS users and permissions (deploy/nats/auth.conf) enforced on a
3-node cluster, the history stream's deny_delete / deny_purge, and TLS with a generated CA.

* Every service runs under its own identity and the fault suite's load completes (tool calls, parallel
  calls, malformed JSON, gates answered by the ``operator`` user) with no permission violation.
* A tool worker's identity cannot write history, commit, drive loops, serve or read other tools'
  requests, read other identities' inboxes or live events, or answer requests it never received.
  The model-step's identity cannot write history (only commit through the committer). Nobody, the
  committer included, may purge or delete history; the stream itself refuses both as well.
* TLS: services verify the server against a throw-away CA (LW_NATS_TLS_CA); mutual TLS with
  LW_NATS_TLS_CERT / LW_NATS_TLS_KEY.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from services.tools.builtins import BUILTINS
from services.tools.sdk import ToolContext, invoke
from services.toolwire.bucket import ensure_tools_bucket, read_entry, registration_key, tools_bucket_keys
from services.toolwire.protocol import CallIds
from services.toolwire.spec import Registration, ToolSpec
from shared.connect import connect
from shared.content import TextBlock
from shared.natsserver import NatsServer
from shared.publish import js_publish
from shared.settings import Settings
from shared.streams import ensure_all, ensure_history_stream
from shared.subjects import H_EXPECTED_LAST_SUBJECT_SEQ, H_MSG_ID
from tests import natsfixtures
from tests.syshelpers import history
from tests.system import reports
from tests.system.faultchecks import verify_loop
from tests.system.faultload import Load
from tests.system.faultscript import quick_script, script, write_model
from tests.system.fleet import fleet
from tests.system.natssec import (
    SecuredCluster,
    identity_env,
    make_certs,
    secured_cluster,
    tls_config,
    violations,
)

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.cluster, pytest.mark.timeout(600)]

ROLE_USERS = {
    "committer": "committer",
    "model-step": "model_step",
    "tools-calculator": "tool_calculator",
    "tools-clock": "tool_clock",
    "tools-sleep": "tool_sleep",
}
SECURE_FLEET = {"committer": 2, "model-step": 2, "tools-calculator": 2, "tools-clock": 2, "tools-sleep": 2}
HISTORY = "LW_HISTORY"  # auth.conf is written for LW_PREFIX=lw


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredCluster]:
    with secured_cluster(tmp_path_factory.mktemp("secured")) as s:
        yield s


def as_user(sc: SecuredCluster, user: str) -> Settings:
    env = {"LW_NATS_URL": ",".join(sc.urls), "LW_PREFIX": "lw", "LW_REPLICAS": "3", **identity_env(sc, user)}
    return Settings.from_env(env)


async def stream_state(sc: SecuredCluster) -> tuple[int, int]:
    nc = await connect(as_user(sc, "committer"))
    try:
        info = await ensure_history_stream(nc.jetstream(timeout=5), as_user(sc, "committer"))
        return int(info.state.messages), int(info.state.last_seq)
    finally:
        await nc.close()


def node_log_sizes(sc: SecuredCluster) -> list[int]:
    return [len(n.log_tail(1_000_000)) for n in sc.cluster.nodes]


def new_log_lines(sc: SecuredCluster, sizes: list[int]) -> list[str]:
    out: list[str] = []
    for n, size in zip(sc.cluster.nodes, sizes, strict=True):
        out += n.log_tail(1_000_000)[size:].splitlines()
    return out


async def test_every_service_under_its_own_identity_runs_the_fault_load(sc: SecuredCluster, tmp_path: Path) -> None:
    operator = as_user(sc, "operator")
    sizes = node_log_sizes(sc)
    roles = {role: identity_env(sc, user) for role, user in ROLE_USERS.items()}
    with fleet(operator, sc.cluster, counts=SECURE_FLEET, role_env=roles, log_dir=tmp_path / "logs") as f:
        nc = await connect(operator)
        try:
            # the operator may not subscribe to lw.hist.>: it follows loops by reading history
            load = Load(nc, operator, write_model(tmp_path, script(), "script.json"), 20, follow_history=False)
            await load.run(timeout=180)
            problems: list[str] = []
            for st in load.loops.values():
                c = await verify_loop(nc, operator, st)
                problems += [f"{st.loop_id}: {v}" for v in c.violations]
        finally:
            await nc.close()
        assert not f.all_running(), f.all_running()
    assert load.completed == 20 and not problems, problems[:20]
    assert load.steps_committed == 200
    # no service needed a permission it lacks (the server logs every violation)
    denied = [line for line in new_log_lines(sc, sizes) if "Violation" in line or "violation" in line]
    assert not denied, denied[:10]
    reports.add_figure("security: loops completed under per-service identities", f"{load.completed}/20")


async def test_permissions_refuse_what_they_should(sc: SecuredCluster) -> None:
    before = await stream_state(sc)
    loop = str(uuid.uuid4())
    api_guards = [f"$JS.API.STREAM.{op}.{HISTORY}" for op in ("PURGE", "DELETE", "UPDATE", "MSG.DELETE")]
    await check_tool_worker_permissions(sc, loop, api_guards)
    # The model-step reaches history only through the committer.
    await check_refused(
        sc,
        "model_step",
        [f"lw.hist.{loop}", f"lw.api.{loop}.answer", *api_guards],
        [
            ("lw.commit.*", "committer"),
            ("_INBOX_committer.>", ""),
            ("_INBOX_tool_calculator.>", ""),
            ("lw.tool.calculator", "tool_calculator"),
        ],
    )
    # Nobody purges or deletes history, the committer included; clients neither write nor commit.
    await check_refused(
        sc, "committer", api_guards, [("_INBOX_model_step.>", ""), ("lw.tool.calculator", "tool_calculator")]
    )
    await check_refused(
        sc,
        "operator",
        [f"lw.hist.{loop}", f"lw.commit.{loop}", *api_guards],
        [("lw.hist.>", ""), ("_INBOX_model_step.>", "")],
    )
    await check_refused(sc, "reader", [f"lw.api.{loop}.start", f"lw.hist.{loop}", f"lw.commit.{loop}"], [])
    await check_model_step_append_gets_no_ack(sc, loop)
    assert await stream_state(sc) == before, "a refused request changed the history stream"


async def test_every_tool_registry_reader_may_read_the_tools_bucket_directly(sc: SecuredCluster) -> None:
    """A starting tool registry reads the entries its watch has not delivered yet directly (their
    keys from the stream's info, each entry with a message get): the model-step, the operator's CLI
    and console, and an MCP bridge may all do so."""
    worker = await connect(as_user(sc, "tool_calculator"))
    names = as_user(sc, "tool_calculator").names
    key = registration_key("calculator", f"sec-{uuid.uuid4().hex[:8]}")
    try:
        kv = await ensure_tools_bucket(worker.jetstream(timeout=5), names, replicas=3)
        reg = Registration(worker_id=key.partition(".")[2], spec=ToolSpec(name="calculator"))
        await kv.put(key, msgspec.json.encode(reg))
        for user in ("model_step", "operator", "mcp_time"):
            nc = await connect(as_user(sc, user))
            try:
                keys, last = await tools_bucket_keys(nc, names)
                entry = await read_entry(nc, names, key)
            finally:
                await nc.close()
            assert key in keys and entry is not None and 0 < entry.revision <= last, user
            assert msgspec.json.decode(entry.value, type=Registration) == reg, user
        await kv.delete(key)
    finally:
        await worker.close()


async def test_the_kv_memory_worker_may_remember_recall_and_list_notes(sc: SecuredCluster) -> None:
    """Its identity may write the memory bucket, read an entry and list a loop's keys (a headers-only
    ordered consumer) on the R3 cluster."""
    settings = as_user(sc, "tool_kv_memory")
    nc = await connect(settings)
    ctx = ToolContext(ids=CallIds(loop_id=str(uuid.uuid4())), nc=nc, settings=settings)

    async def run(args: dict[str, str]) -> str:
        r = await invoke(BUILTINS["kv_memory"], msgspec.json.encode(args), ctx)
        out = "".join(b.text for b in r.blocks if isinstance(b, TextBlock))
        assert not r.is_error, out
        return out

    try:
        for key in ("b", "a"):
            await run({"action": "remember", "key": key, "value": key * 3})
        assert await run({"action": "recall", "key": "a"}) == "aaa"
        assert await run({"action": "list"}) == "a\nb"
    finally:
        await nc.close()


async def check_refused(sc: SecuredCluster, user: str, publish: list[str], subscribe: list[tuple[str, str]]) -> None:
    """``user`` gets one permissions violation per subject it publishes to or subscribes to (with queue)."""
    pw = sc.passwords
    seen = await violations(
        sc.urls, user, pw[user], publish=publish, subscribe=subscribe, expect=len(publish) + len(subscribe)
    )
    assert len(seen) == len(publish) + len(subscribe), (user, seen)
    assert all("permissions violation" in s for s in seen), (user, seen)
    for subject in publish:
        # (nats-py lower-cases the server's error text)
        assert any(f'publish to "{subject.lower()}"' in s.lower() for s in seen), (user, subject, seen)
    for subject, _ in subscribe:
        assert any(f'subscription to "{subject.lower()}"' in s.lower() for s in seen), (user, subject, seen)


async def check_tool_worker_permissions(sc: SecuredCluster, loop: str, api_guards: list[str]) -> None:
    # A tool worker: no history, no commits, no loop API, no live events, no forged replies, no admin API ...
    await check_refused(
        sc,
        "tool_calculator",
        [
            f"lw.hist.{loop}",
            f"lw.commit.{loop}",
            f"lw.api.{loop}.start",
            f"lw.live.{loop}",
            "_INBOX_model_step.forged-reply",
            *api_guards,
        ],
        # ... and it reads nobody else's requests, inboxes or events
        [
            ("lw.tool.clock", "tool_clock"),
            ("lw.tool.clock", ""),
            ("lw.tool.calculator", ""),
            ("lw.tool.>", "tool_calculator"),
            ("_INBOX_model_step.>", ""),
            ("_INBOX.>", ""),
            ("_INBOX_operator.>", ""),
            ("_INBOX_tool_clock.>", ""),
            ("lw.hist.>", ""),
            ("lw.commit.*", "committer"),
            ("lw.api.*.*", "committer"),
            ("lw.live.>", ""),
        ],
    )
    # ... while what it needs is allowed (so the refusals above are not a blanket "no")
    ok = await violations(
        sc.urls,
        "tool_calculator",
        sc.passwords["tool_calculator"],
        expect=0,
        subscribe=[("lw.tool.calculator", "tool_calculator"), ("lw.toolctl.*", ""), ("_INBOX_tool_calculator.>", "")],
    )
    assert ok == []


async def check_model_step_append_gets_no_ack(sc: SecuredCluster, loop: str) -> None:
    """A JetStream-style append by the model-step's identity gets no ack (and so stores nothing)."""
    ms = await connect(as_user(sc, "model_step"))
    try:
        with pytest.raises(Exception, match=r"no answer|no responders"):
            await js_publish(
                ms,
                f"lw.hist.{loop}",
                b'{"v":1}',
                {H_MSG_ID: str(uuid.uuid4()), H_EXPECTED_LAST_SUBJECT_SEQ: "0"},
                request_timeout=1.0,
            )
    finally:
        await ms.close()


class _ApiErr(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _ApiResp(msgspec.Struct):
    error: _ApiErr | None = None
    success: bool = False


async def test_history_stream_refuses_delete_and_purge_itself(nats_server: NatsServer) -> None:
    """Even an identity with every permission cannot remove history: the stream says no."""
    settings = Settings.from_env({}, nats_urls=(nats_server.url,), prefix=natsfixtures.unique_prefix())
    n = settings.names
    nc = await connect(settings)
    try:
        js = nc.jetstream(timeout=5)
        info = await ensure_history_stream(js, settings)
        assert info.config.deny_delete and info.config.deny_purge
        loop = str(uuid.uuid4())
        for k in range(2):
            await js_publish(nc, n.hist(loop), b'{"k":%d}' % k, {H_MSG_ID: str(uuid.uuid4())}, request_timeout=5)
        before = (await js.stream_info(n.history_stream)).state
        refusals: list[str] = []
        for subject, body in (
            (f"$JS.API.STREAM.PURGE.{n.history_stream}", b"{}"),
            (f"$JS.API.STREAM.PURGE.{n.history_stream}", b'{"filter": "%s"}' % n.hist(loop).encode()),
            (f"$JS.API.STREAM.MSG.DELETE.{n.history_stream}", b'{"seq": 1}'),
            (f"$JS.API.STREAM.MSG.DELETE.{n.history_stream}", b'{"seq": 2, "no_erase": true}'),
        ):
            reply = msgspec.json.decode((await nc.request(subject, body, timeout=5)).data, type=_ApiResp)
            assert reply.error is not None and not reply.success, (subject, reply)
            refusals.append(reply.error.description)
        after = (await js.stream_info(n.history_stream)).state
        assert (after.messages, after.first_seq, after.last_seq) == (before.messages, before.first_seq, before.last_seq)
        assert all("not permitted" in r or "denied" in r for r in refusals), refusals
    finally:
        await nc.close()


# --- TLS ------------------------------------------------------------------------------------------


async def _refused(url: str, **options: object) -> str:
    try:
        nc = await nats.connect(url, allow_reconnect=False, connect_timeout=3, max_reconnect_attempts=0, **options)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    await nc.close()
    return ""


async def test_services_run_a_loop_over_tls_with_a_generated_ca(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    server = NatsServer(extra_config=tls_config(certs)).start()
    try:
        settings = Settings.from_env(
            {}, nats_urls=(server.url,), prefix=natsfixtures.unique_prefix(), nats_tls_ca=str(certs.ca)
        )
        counts = {"committer": 1, "model-step": 1, "tools-calculator": 1}
        with fleet(settings, counts=counts, env={"LW_NATS_TLS_CA": str(certs.ca)}, log_dir=tmp_path / "logs"):
            nc: NATS = await connect(settings)
            try:
                assert nc._server_info.get("tls_required"), "the server does not require TLS"
                load = Load(nc, settings, write_model(tmp_path, quick_script(), "quick.json"), 3, policy={})
                await load.run(timeout=90)
                for st in load.loops.values():
                    kinds = [type(e).__name__ for _, e in await history(nc, settings, st.loop_id)]
                    assert kinds.count("StepDone") == 2 and "TurnDone" in kinds, kinds
            finally:
                await nc.close()
        assert load.completed == 3
        # Without TLS, or trusting only the system's CAs, nobody gets in.
        assert await _refused(server.url)
        assert "CERTIFICATE_VERIFY_FAILED" in await _refused(server.url, tls=ssl.create_default_context())
    finally:
        server.cleanup()


async def test_mutual_tls_requires_a_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    server = NatsServer(extra_config=tls_config(certs, verify_clients=True)).start()
    try:
        base = {"LW_NATS_URL": server.url, "LW_PREFIX": natsfixtures.unique_prefix(), "LW_NATS_TLS_CA": str(certs.ca)}
        with_cert = Settings.from_env(
            {**base, "LW_NATS_TLS_CERT": str(certs.client_cert), "LW_NATS_TLS_KEY": str(certs.client_key)}
        )
        nc = await connect(with_cert, max_reconnect_attempts=0)
        try:
            await ensure_all(nc.jetstream(timeout=5), with_cert)  # JetStream works over mutual TLS
        finally:
            await nc.close()
        ctx = ssl.create_default_context(cafile=str(certs.ca))  # trusts the server, has no certificate
        assert await _refused(server.url, tls=ctx)
    finally:
        server.cleanup()
