"""What the driver does with one call of a step (policy.authorise), as tables of facts → decision."""

from __future__ import annotations

import pytest

from services.model_step.policy import (
    COPIED_GATE_APPROVED,
    FORK_REUSED,
    GATE_DENIED,
    RERUN_APPROVED,
    Authorisation,
    CallFacts,
    Prior,
    SourceFacts,
    authorise,
)

A = Authorisation
RESTS_WITHOUT = SourceFacts(result=False, busy=False)  # the source rests and never made the call
HAS_RESULT = SourceFacts(result=True, busy=False)
BUSY = SourceFacts(result=False, busy=True)
BUSY_WAITED = SourceFacts(result=False, busy=True, waited=True)
BUSY_COPIED = SourceFacts(result=False, busy=True, copied=True)  # busy when the fork copied its calls


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # A new step (nothing known of an earlier run): the loop's policy decides.
        (CallFacts(), A.ALLOW_NO_POLICY),
        (CallFacts(has_policy=True), A.ALLOW_POLICY),
        (CallFacts(granted=True, has_policy=True), A.ALLOW_GRANTED),
        (CallFacts(granted=True), A.ALLOW_GRANTED),
        (CallFacts(effect="deny", has_policy=True), A.DENY_POLICY),
        (CallFacts(effect="ask", has_policy=True), A.ASK_PERMISSION),
        (CallFacts(user_input=True), A.ASK_USER),
        # Calls that never run: the executor reports them, nothing is authorised.
        (CallFacts(known_tool=False), A.UNCHECKED),
        (CallFacts(minted=True, effect="deny"), A.UNCHECKED),
        (CallFacts(invalid=True, user_input=True), A.UNCHECKED),
    ],
    ids=[
        "no-policy",
        "policy-allows",
        "granted",
        "granted-without-policy",
        "policy-denies",
        "policy-asks",
        "user-input",
        "unknown-tool",
        "minted-id",
        "invalid-arguments",
    ],
)
def test_a_new_call_follows_the_policy(facts: CallFacts, expected: Authorisation) -> None:
    assert authorise(facts) is expected


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # Finished in an earlier run: its outcome stands, whatever else is known.
        (CallFacts(prior=Prior.RECORDED, effect="deny"), A.REUSE_RECORDED),
        (CallFacts(prior=Prior.RECORDED, decided=GATE_DENIED), A.REUSE_RECORDED),
        (CallFacts(prior=Prior.RECORDED, fork_rule="ask", minted=False), A.REUSE_RECORDED),
        # Never started: decided as in a new step (or by the step's recorded decision).
        (CallFacts(prior=Prior.NONE, effect="ask"), A.ASK_PERMISSION),
        (CallFacts(prior=Prior.NONE, decided="gate_approved"), A.KEEP_DECIDED),
        # Possibly run, unfinished: a destructive tool is never run again unasked.
        (CallFacts(prior=Prior.UNKNOWN), A.DENY_UNKNOWN),
        (CallFacts(prior=Prior.UNKNOWN, ask_on_unknown=True), A.ASK_UNKNOWN),
        (CallFacts(prior=Prior.UNKNOWN, known_tool=False, ask_on_unknown=True), A.ASK_UNKNOWN),
        (CallFacts(prior=Prior.UNKNOWN, decided="gate_approved"), A.DENY_UNKNOWN),
        # ... a read-only or idempotent one runs again (its policy still applies);
        (CallFacts(prior=Prior.UNKNOWN, rerun_safe=True), A.ALLOW_NO_POLICY),
        (CallFacts(prior=Prior.UNKNOWN, rerun_safe=True, effect="ask"), A.ASK_PERMISSION),
        # ... and an operator's answer at the outcome_unknown gate stands.
        (CallFacts(prior=Prior.UNKNOWN, decided=RERUN_APPROVED), A.KEEP_DECIDED),
        (CallFacts(prior=Prior.UNKNOWN, decided=GATE_DENIED, ask_on_unknown=True), A.KEEP_DECIDED),
    ],
    ids=[
        "recorded",
        "recorded-despite-denial",
        "recorded-in-a-fork",
        "never-started",
        "never-started-decided",
        "unknown-error",
        "unknown-ask",
        "unknown-unknown-tool",
        "unknown-other-answer",
        "unknown-rerun-safe",
        "unknown-rerun-safe-asks",
        "unknown-rerun-approved",
        "unknown-gate-denied",
    ],
)
def test_a_rerun_step_reuses_finished_calls_and_never_repeats_an_unknown_outcome_unasked(
    facts: CallFacts, expected: Authorisation
) -> None:
    assert authorise(facts) is expected


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # The source is read before a fork's call is decided.
        (CallFacts(fork_rule="reuse"), A.READ_SOURCE),
        (CallFacts(fork_rule="reuse", known_tool=False), A.UNCHECKED),
        # The source committed an equal call: the fork's rule decides.
        (CallFacts(fork_rule="reuse", source=HAS_RESULT), A.REUSE_SOURCE),
        (CallFacts(fork_rule="ask", source=HAS_RESULT), A.ASK_FORK),
        (CallFacts(fork_rule="rerun", source=HAS_RESULT, effect="deny"), A.DENY_POLICY),
        # The source rests without it: an ordinary call.
        (CallFacts(fork_rule="ask", source=RESTS_WITHOUT, effect="ask"), A.ASK_PERMISSION),
        (CallFacts(fork_rule="ask", source=RESTS_WITHOUT, user_input=True), A.ASK_USER),
        # The source may be running it: harmless tools run, any other waits, then asks.
        (CallFacts(fork_rule="reuse", source=BUSY, rerun_safe=True), A.ALLOW_NO_POLICY),
        (CallFacts(fork_rule="reuse", source=BUSY), A.WAIT_FOR_SOURCE),
        (CallFacts(fork_rule="reuse", source=BUSY_WAITED), A.ASK_FORK_RUNNING),
        (CallFacts(fork_rule="reuse", source=SourceFacts(result=True, busy=True, waited=True)), A.REUSE_SOURCE),
        # ... as the fork copied it: nothing to wait for (the source is never read), it asks at once.
        (CallFacts(fork_rule="reuse", source=BUSY_COPIED), A.ASK_FORK_RUNNING),
        (CallFacts(fork_rule="rerun", source=BUSY_COPIED, rerun_safe=True), A.ALLOW_NO_POLICY),
        (CallFacts(fork_rule="reuse", source=SourceFacts(result=True, busy=True, copied=True)), A.REUSE_SOURCE),
        # Approved at a gate the fork copied open: the rule still decides a repeated call.
        (CallFacts(fork_rule="ask", decided=COPIED_GATE_APPROVED), A.READ_SOURCE),
        (CallFacts(fork_rule="ask", decided=COPIED_GATE_APPROVED, source=HAS_RESULT), A.ASK_FORK),
        (CallFacts(fork_rule="reuse", decided=COPIED_GATE_APPROVED, source=HAS_RESULT), A.REUSE_SOURCE),
        (CallFacts(fork_rule="rerun", decided=COPIED_GATE_APPROVED, source=HAS_RESULT), A.KEEP_DECIDED),
        (CallFacts(fork_rule="ask", decided=COPIED_GATE_APPROVED, source=RESTS_WITHOUT), A.KEEP_DECIDED),
        (CallFacts(fork_rule="ask", decided=COPIED_GATE_APPROVED, source=BUSY), A.WAIT_FOR_SOURCE),
        (CallFacts(fork_rule="ask", decided=COPIED_GATE_APPROVED, source=BUSY_COPIED), A.ASK_FORK_RUNNING),
        (CallFacts(fork_rule="ask", decided=COPIED_GATE_APPROVED, invalid=True), A.KEEP_DECIDED),
        # Denied at a fork_rerun gate: the source's result, if it has one.
        (CallFacts(fork_rule="ask", decided=FORK_REUSED), A.READ_SOURCE),
        (CallFacts(fork_rule="ask", decided=FORK_REUSED, source=HAS_RESULT), A.KEEP_SOURCE_RESULT),
        (CallFacts(fork_rule="ask", decided=FORK_REUSED, source=BUSY), A.DENY_NO_SOURCE_RESULT),
        (CallFacts(fork_rule="ask", decided=FORK_REUSED, source=BUSY_COPIED), A.DENY_NO_SOURCE_RESULT),
        # Any other answer stands without reading the source.
        (CallFacts(fork_rule="ask", decided="gate_approved"), A.KEEP_DECIDED),
    ],
    ids=[
        "read-first",
        "unknown-tool-unread",
        "committed-reuse",
        "committed-ask",
        "committed-rerun-policy",
        "rests-ordinary",
        "rests-user-input",
        "busy-rerun-safe",
        "busy-wait",
        "busy-after-waiting",
        "committed-while-waiting",
        "copied-busy-asks-at-once",
        "copied-busy-rerun-safe",
        "copied-busy-committed",
        "copied-read-first",
        "copied-ask",
        "copied-reuse",
        "copied-rerun",
        "copied-rests",
        "copied-busy",
        "copied-gate-busy-copy",
        "copied-invalid",
        "denied-read-first",
        "denied-takes-result",
        "denied-no-result",
        "denied-no-copied-result",
        "answered",
    ],
)
def test_a_fork_decides_a_repeated_call_from_what_its_source_did(facts: CallFacts, expected: Authorisation) -> None:
    assert authorise(facts) is expected
