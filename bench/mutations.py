"""Mutation check of the security tests: every documented weakening, applied to a copy of the source, must make
some test fail. Run by hand (minutes), not by `make test`:

    .venv/bin/python bench/mutations.py [--only NAME] [--no-baseline] [--out bench/results/mutations.json]

The repository is copied to a temporary folder (without .venv, runs, .git, caches); the tests run there with
this interpreter, from the copy and with PYTHONPATH at it (checked: the copy's package is the one imported).
First a baseline: the mapped test files must pass on the unmutated copy, so a test that fails anyway is never
counted as a catch. Then, per mutation: replace one exact string in one file (it must occur exactly once, else
the mutation is reported STALE), run its test files with `-x -q`, report the first failing test or NOT CAUGHT,
and restore the file. Writes a JSON record and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "mutations.json"
TEST_TIMEOUT_S = 300  # per test (pytest-timeout): a weakening that hangs a run fails the test that waits
RUN_TIMEOUT_S = 1800  # per mutation, the whole pytest run
PROPS, ADV, LINKS = "tests/test_security_properties.py", "tests/test_adversaries.py", "tests/test_links.py"
SKIPPED = ("*.pyc", "__pycache__", ".venv", "runs", ".git", ".hypothesis", ".pytest_cache", "*.egg-info")
NOOP = "(lambda *args: None)("  # a call that checks nothing, where a signature was verified


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the weakening, in words
    path: str  # the file it edits, relative to the repository
    old: str  # must occur exactly once in that file
    new: str
    tests: tuple[str, ...]  # the test files that must catch it, cheapest first
    note: str = ""  # for a weakening that is no break on its own: why


M = Mutation
HS, CH = "falsevfl_secure/network/handshake.py", "falsevfl_secure/network/channel.py"
LOSSES, LOSS = "falsevfl_secure/runtime/losses.py", "tests/test_party_loss.py"
MUTATIONS = (
    M("roster-signature-unchecked", "a role takes the active party's roster (and its answer to a returning party) "
      "without checking its signature", HS,
      'verify(self.cast.pins[active], step, body,', NOOP + 'self.cast.pins[active], step, body,',
      (PROPS, ADV), "no break alone: the roster travels only on the mutual-TLS link from the active party, which "
      "holds the signing key, and its hub forwards no envelope whose sender is not the link's peer; every check "
      "on the roster's content (hellos, protocol, two-party rule, own fresh hello) still runs"),
    M("hello-signature-unchecked", "the hellos in a roster are taken without checking their owners' signatures", HS,
      'verify(self.cast.pins[name], "hello",', NOOP + 'self.cast.pins[name], "hello",', (PROPS, ADV)),
    M("x25519-signature-unchecked", "relayed X25519 keys are taken without checking their owners' signatures", HS,
      'verify(self.cast.pins[name], "x25519",', NOOP + 'self.cast.pins[name], "x25519",', (PROPS, ADV)),
    M("tls-client-auth-off", "a hub accepts TLS clients without a certificate",
      "falsevfl_secure/network/link.py", "require_client_auth=True", "require_client_auth=False", (LINKS, ADV)),
    M("he-zero-reused", "the he helper's queue hands the same encryption of zero out again",
      "falsevfl_secure/secure/zero_maker.py", "return self._ready.popleft()", "return self._ready[0]",
      ("tests/test_secure_ckks.py",)),
    M("max-ids-off", "a passive party aligns with lists longer than its own max_ids",
      "falsevfl_secure/secure/align.py", "if counts.min() < 0 or counts.max() > bound or counts[rank] != n:",
      "if counts.min() < 0 or counts[rank] != n:", ("tests/test_align.py",)),
    M("protocol-from-roster", "a role runs the protocol the roster announces, not its own file's", HS,
      'if roster["protocol"] != self.agreement.get("protocol") and len(present) > 1:', "if False:", (PROPS, ADV)),
    M("two-party-rule-skipped", "a role joins a two-party roster under mpc without its own consent", HS,
      "check_two_parties(len(present), self.agreement, request.source, self.hides)\n        return tuple(present)",
      "return tuple(present)", (PROPS, ADV)),
    M("pair-keys-from-transcript", "pair keys derive from the public session transcript, not the X25519 secret",
      "falsevfl_secure/secure/masks.py", "keys[peer] = derive_pair_key(shared, transcript, rank, peer, purpose)",
      "keys[peer] = derive_pair_key(transcript, transcript, rank, peer, purpose)", (PROPS, ADV)),
    M("fixed-nonce", "every relayed pair frame is sealed under nonce counter 0", CH,
      "return _NONCE.pack(sender, count)", "return _NONCE.pack(sender, 0)", (PROPS, LINKS)),
    M("nonce-counter-per-channel", "the nonce counters live in the channel object (a second channel restarts them)",
      CH, "self._counts = _COUNTS", "self._counts = {}", (PROPS, LINKS)),
    M("pair-frames-unsealed", "frames between passive parties cross the relay unsealed", CH,
      "return self.peers.active_index not in (self.rank, peer)", "return False", (PROPS, LINKS)),
    M("plain-accepts-non-finite", "under plain the active party sums non-finite contributions it receives",
      "falsevfl_secure/transport/ciphers/plain.py",
      "check_contributions(round, list(values), list(values.values()), self.n_parties)", "pass", (PROPS,)),
    M("aggregator-bounds-ignored", "the he aggregator takes every sum up to 2^22 values, not the declared size",
      "falsevfl_secure/transport/sums.py", "    peers.network.allow(bounds)\n",
      "    peers.network.allow({k: cipher.wire_bytes(by_name(k), AGGREGATED_VALUES) for k in bounds})\n",
      ("tests/test_operations.py",)),
    M("readmission-taken-as-announced", "a party takes an epoch frame's readmissions and version as announced",
      LOSSES, "if not set(names) <= out or len(set(names)) != len(names) or notice[\"version\"] < self.version + "
      "len(names):", "if False:", (LOSS,)),
    M("announced-loss-unchecked", "a party takes an announced loss without checking its own file's min_parties and "
      "two-party consent", LOSSES, "        self._check_policy()  # its own file", "        pass  # its own file",
      (LOSS,)),
    M("ckks-floor-off", "a he message's ciphertexts are loaded however few bytes they take (a zeroed one, compressed, "
      "loads as 2,000 times its size)", "falsevfl_secure/secure/ckks.py",
      "if lengths and min(lengths) < (floor := min_ciphertext_bytes(ctx)):", "if False:",
      ("tests/test_secure_ckks.py::test_a_message_cannot_make_its_receiver_hold_far_more_than_its_bytes",)),
    M("heartbeat-counts-as-sent", "a heartbeat's work count renews a peer's progress whenever it changes, down too",
      "falsevfl_secure/network/link.py", "if work > self.work:", "if work != self.work:",
      (f"{LINKS}::test_a_peer_cannot_renew_its_progress_by_flipping_its_counts",)),
    M("setup-allowance-kept", "the set-up steps' allowances (3 GiB per sender) last the whole run",
      "falsevfl_secure/network/network.py", "for tag in BEFORE_ROUNDS if not self._rounds_declared else ():",
      "for tag in ():", (f"{LINKS}::test_the_set_up_steps_allowance_ends_when_the_rounds_begin",)),
    M("relay-speaks-for-anyone", "a passive party takes any sender name on a frame from the relay",
      "falsevfl_secure/network/network.py", "envelope.src not in self.pins or envelope.src == self.me", "False",
      (f"{LINKS}::test_the_relay_cannot_speak_for_a_role_that_is_not_in_the_run",)),
    M("plain-accounted-as-sum", "under plain a passive party accounts its releases as if only sums were revealed",
      "falsevfl_secure/privacy.py", "    if hides_contributions or active:\n        return 1",
      "    if True:\n        return 1",
      ("tests/test_privacy.py::test_under_plain_a_contribution_seen_alone_stays_inside_its_partys_privacy_region",
       "tests/test_privacy.py::test_a_simulation_with_a_budget_reports_each_partys_epsilon")),
    M("repeated-loss-followed", "a party follows a loss notice that names no party newly lost", LOSSES,
      'if not set(notice["lost"]) - {peers.names[k] for k in peers.lost}:', "if False:",
      (f"{LOSS}::test_an_active_party_cannot_make_a_party_run_steps_again_by_announcing_the_same_loss",)),
    M("epoch-resume-unclamped", "a loss announced between epochs resumes the epoch at step -1 (its last step first)",
      "falsevfl_secure/train.py", "resumed = max(0, handler(lost, (int(stage)",
      "resumed = int(handler(lost, (int(stage)",
      (f"{LOSS}::test_an_epoch_resumes_where_the_loss_says_and_a_step_run_again_is_charged",)),
    M("noise-stage-passes-non-finite", "the noise stage puts a non-finite contribution on the grid (-2^63, finite)",
      "falsevfl_secure/transport/ciphers/noise.py", "if not bool(torch.isfinite(raw).all()):", "if False:",
      ("tests/test_privacy.py::test_a_non_finite_contribution_is_refused_by_every_cipher_and_never_leaves_past_the_clip",)),
)


def copy_repository(folder: Path) -> Path:
    """The repository without its environment, runs, history and caches."""
    copy = folder / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*SKIPPED))
    return copy


def environment(copy: Path) -> dict[str, str]:
    # the copy first on the path (the editable install points at the original); no stale bytecode between mutations
    return {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}


def check_imports_copy(copy: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", "import falsevfl_secure; print(falsevfl_secure.__file__)"],
                           cwd=copy, env=environment(copy), capture_output=True, text=True, check=True)
    imported = Path(probe.stdout.strip()).resolve()
    if not imported.is_relative_to(copy.resolve()):
        raise SystemExit(f"error: the copy imports {imported}, not its own package under {copy}")


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[str, str | None, float]:
    """("passed" | "failed" | "error", the first failing test id, seconds) of one pytest run in the copy."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE",
               f"--timeout={TEST_TIMEOUT_S}", *tests]
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=copy, env=environment(copy), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group (not yet reaped): the run and the roles it started
        proc.communicate()
        return "error", f"pytest ran past {RUN_TIMEOUT_S} s", time.monotonic() - started
    seconds = time.monotonic() - started
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    if proc.returncode == 0:
        return "passed", None, seconds
    if proc.returncode == 1 and failed:
        return "failed", failed[0], seconds
    return "error", f"pytest exit {proc.returncode}: {output.strip().splitlines()[-1:]}", seconds


def mutate(copy: Path, mutation: Mutation) -> dict:
    """Apply one mutation, run its tests, restore the file; the record of what happened."""
    target = copy / mutation.path
    original = target.read_text()
    record = {**asdict(mutation), "tests": list(mutation.tests)}
    del record["old"], record["new"]
    matches = original.count(mutation.old)
    if matches != 1:
        return {**record, "status": "STALE", "caught_by": None, "detail": f"the string occurs {matches} times",
                "seconds": 0.0}
    target.write_text(original.replace(mutation.old, mutation.new))
    try:
        outcome, test, seconds = run_tests(copy, mutation.tests)
    finally:
        target.write_text(original)
    status = {"failed": "caught", "passed": "NOT CAUGHT"}.get(outcome, "ERROR")
    status += " (no break alone)" if mutation.note and outcome == "passed" else ""
    return {**record, "status": status, "caught_by": test if outcome == "failed" else None,
            "detail": test if outcome == "error" else None, "seconds": round(seconds, 1)}


def baseline(copy: Path, chosen: list[Mutation]) -> None:
    """The mapped test files must pass on the unmutated copy."""
    files = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    outcome, test, seconds = run_tests(copy, files)
    print(f"baseline ({', '.join(files)}): {outcome} in {seconds:.0f} s", flush=True)
    if outcome != "passed":
        raise SystemExit(f"error: the unmutated copy fails {test}; fix that before reading any mutation result")


def table(records: list[dict]) -> str:
    rows = ["| mutation | weakening | caught by | s |", "|---|---|---|---|"]
    for r in records:
        why = r.get("detail") or (r.get("note") if not r["caught_by"] else "") or ""
        caught = f"`{r['caught_by']}`" if r["caught_by"] else f"**{r['status']}**: {why}".strip(": ")
        rows.append(f"| {r['name']} | {r['what']} (`{r['path']}`) | {caught} | {r['seconds']:.0f} |")
    return "\n".join(rows)


def save(out: Path, records: list[dict]) -> None:
    """Write the records; with --only, the other mutations' earlier records are kept."""
    earlier = json.loads(out.read_text())["mutations"] if out.exists() else []
    fresh = {r["name"] for r in records}
    order = [m.name for m in MUTATIONS]
    merged = sorted([r for r in earlier if r["name"] not in fresh and r["name"] in order] + records,
                    key=lambda r: order.index(r["name"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"generated_by": "bench/mutations.py", "python": sys.version.split()[0],
                               "mutations": merged}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=[m.name for m in MUTATIONS], action="append",
                        help="run this mutation only (repeatable)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated copy")
    parser.add_argument("--tests", action="append", help="run these test files or ids instead of the mapped ones "
                        "(to see whether one particular test catches a mutation)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    chosen = [replace(m, tests=tuple(args.tests)) for m in chosen] if args.tests else chosen
    with tempfile.TemporaryDirectory(prefix="falsevfl-mutations-") as folder:
        copy = copy_repository(Path(folder))
        check_imports_copy(copy)
        if not args.no_baseline:
            baseline(copy, chosen)
        records = []
        for mutation in chosen:
            records.append(mutate(copy, mutation))
            print(f"{mutation.name}: {records[-1]['status']} {records[-1]['caught_by'] or ''}", flush=True)
    if args.tests and args.out == OUT:
        print(f"(--tests: {OUT.relative_to(ROOT)} keeps the mapped tests' results; pass --out to save these)")
    else:
        save(args.out, records)
    print(table(records))
    return 0 if all(r["status"] == "caught" or r["note"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
