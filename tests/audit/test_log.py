"""The transparency log: the tree the sealer grows, checked against pymerkle (an RFC 9162 tree kept
apart from ours) and against C2SP read by hand; tampering with leaves, nodes and checkpoint files;
the witness; the auditors' API."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from pymerkle import InmemoryTree, verify_consistency, verify_inclusion
from pymerkle.proof import InclusionProof

from accounts.roles import Role
from audit import log, merkle, note, signing
from audit.models import Checkpoint, LogNode, PendingSeal
from audit.seals import seal_pending
from audit.verify import verify
from tests.audit.support import audit_verify, sql, triggers_off

pytestmark = pytest.mark.django_db(transaction=True)


def pending(n: int) -> list[PendingSeal]:
    """n pending seals, as n run ends leave them (their chains are not needed by the tree)."""
    return PendingSeal.objects.bulk_create(
        PendingSeal(
            chain=f"run:{uuid.uuid4()}",
            object_type="run",
            object_id=str(i),
            task_id=None,
            seq=3,
            hash=hashlib.sha256(str(i).encode()).hexdigest(),
            created_at=timezone.now(),
        )
        for i in range(n)
    )


def library_tree(leaves: list[bytes]) -> InmemoryTree:
    tree = InmemoryTree(algorithm="sha256")  # RFC 9162 hashing: 0x00 leaves, 0x01 nodes
    for leaf in leaves:
        tree.append_entry(leaf)
    return tree


def library_includes(
    tree: InmemoryTree, index: int, size: int, leaf: bytes, path: list[bytes], root: bytes
) -> bool:
    """Our audit path, checked by pymerkle: its proof is the leaf's hash then the RFC's path, and its
    rule (which side each hash goes) is pymerkle's own, from its layout of (index, size)."""
    theirs = tree.prove_inclusion(index + 1, size)
    ours = InclusionProof("sha256", True, size, index + 1, theirs.rule, [merkle.leaf_hash(leaf), *path])
    try:
        verify_inclusion(merkle.leaf_hash(leaf), root, ours)
    except Exception:  # noqa: BLE001 - pymerkle raises InvalidProof
        return False
    return True


def test_every_root_path_and_proof_of_trees_up_to_70_leaves_agrees_with_pymerkle():
    leaves = [f"leaf {i}".encode() for i in range(70)]
    frontier: dict[merkle.Node, bytes] = {}
    stored: dict[merkle.Node, bytes] = {}
    for i, leaf in enumerate(leaves):
        stored.update(merkle.completed(i, merkle.leaf_hash(leaf), frontier))
    tree = library_tree(leaves)

    def nodes(wanted):
        return {n: stored[n] for n in wanted}

    for size in range(1, 71):
        root = merkle.root(size, nodes)
        assert root == tree.get_root(size), size
        for index in range(size):
            path = merkle.hashes(merkle.ranges_inclusion(index, size), nodes)
            assert path == tree.prove_inclusion(index + 1, size).path[1:]
            assert merkle.inclusion_verify(index, size, merkle.leaf_hash(leaves[index]), path, root)
            assert library_includes(tree, index, size, leaves[index], path, root)
            assert not merkle.inclusion_verify(index, size, merkle.leaf_hash(b"another"), path, root)
            if path:
                bent = [path[0][::-1], *path[1:]]
                assert not merkle.inclusion_verify(index, size, merkle.leaf_hash(leaves[index]), bent, root)
                assert not library_includes(tree, index, size, leaves[index], bent, root)
        for first in range(1, size + 1):
            proof = merkle.hashes(merkle.ranges_consistency(first, size), nodes)
            old = tree.get_root(first)
            assert merkle.consistency_verify(first, size, old, root, proof), (first, size)
            verify_consistency(old, root, tree.prove_consistency(first, size))  # the roots, by pymerkle
            if first < size:
                assert not merkle.consistency_verify(first, size, merkle.leaf_hash(b"forked"), root, proof)
                assert not merkle.consistency_verify(first, size, old, root, proof[:-1])
    assert len(merkle.ranges_inclusion(5_000_000, 10**7)) == 24  # a proof of 10^7 leaves: 24 hashes


def test_the_sealer_grows_one_stored_tree_whose_proofs_agree_with_pymerkle_at_every_signed_size(audit_files):
    sizes = []
    for batch in (1, 2, 3, 5, 8, 13, 1):
        pending(batch)
        assert seal_pending() == batch
        sizes.append(Checkpoint.objects.order_by("-number").first().body["tree"]["size"])
    assert sizes == [1, 3, 6, 11, 19, 32, 33]
    rows = list(PendingSeal.objects.order_by("leaf_index"))
    assert [r.leaf_index for r in rows] == list(range(33))
    tree = library_tree([log.leaf_of(r) for r in rows])
    for checkpoint in Checkpoint.objects.order_by("number"):
        size, root = checkpoint.body["tree"]["size"], bytes.fromhex(checkpoint.body["tree"]["root"])
        assert root == tree.get_root(size) == log.root(size)
        for index in range(size):
            path = log.inclusion(index, size)
            assert library_includes(tree, index, size, log.leaf_of(rows[index]), path, root)
    for first in sizes:
        assert merkle.consistency_verify(
            first, 33, tree.get_root(first), tree.get_root(33), log.consistency(first, 33)
        )
    # 33 leaves store 33 + 16 + 8 + 4 + 2 + 1 complete nodes: twice the leaves, never more.
    assert LogNode.objects.count() == 64
    assert verify(rows=False).problems == [] or all(p.kind != "log" for p in verify(rows=False).problems)


def c2sp_verify(signed: str, name: str, public_key, kind: int = 1) -> tuple[str, bytes]:
    """A signed note read as C2SP signed-note says (written apart from audit.note): the text and the
    signature bytes of key `name`; a cosignature's (kind 4) blob holds its timestamp first."""
    text, _, lines = signed.rpartition("\n\n")
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_hash = hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + raw).digest()[:4]
    for line in lines.splitlines():
        assert line.startswith("\u2014 ")
        who, blob = line[2:].split(" ")
        decoded = base64.b64decode(blob)
        if who == name and decoded[:4] == key_hash:
            return text + "\n", decoded[4:]
    raise AssertionError(f"no signature of {name}")


def test_a_witness_cosigns_what_extends_what_it_kept_and_refuses_a_restored_log(audit_files, tmp_path):
    pending(5)
    seal_pending()
    kept = tmp_path / "witness" / "kept.note"
    witness_key = Ed25519PrivateKey.generate()
    (tmp_path / "w.pem").write_bytes(
        witness_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (tmp_path / "w.pub.pem").write_text(signing.public_pem(witness_key.public_key()))

    def witness(*extra: str) -> tuple[int, str]:
        out = io.StringIO()
        try:
            call_command("audit_witness", str(kept), "--update", *extra, stdout=out)
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue()
        return 0, out.getvalue()

    code, out = witness("--witness-key", str(tmp_path / "w.pem"), "--witness-name", "auditor.example/w1")
    assert code == 0 and "first checkpoint seen: 5 leaves" in out
    pending(6)
    seal_pending()
    code, out = witness("--witness-key", str(tmp_path / "w.pem"), "--witness-name", "auditor.example/w1")
    assert code == 0 and "consistent: 11 leaves extend the kept 5" in out, out

    # The cosignature, read as C2SP tlog-cosignature says: type 0x04, a timestamp, then Ed25519 over
    # "cosignature/v1\ntime <t>\n" and the checkpoint's text.
    text, blob = c2sp_verify(kept.read_text(), "auditor.example/w1", witness_key.public_key(), kind=4)
    (timestamp,) = struct.unpack(">Q", blob[:8])
    witness_key.public_key().verify(blob[8:], f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode())
    assert text.splitlines()[1] == "11"
    args = ("--witnessed", str(kept), "--witness-key", str(tmp_path / "w.pub.pem"))
    assert audit_verify(*args, "--witness-name", "auditor.example/w1")[0] in (0, 1)
    witness_problems = [
        line
        for line in audit_verify(*args, "--witness-name", "auditor.example/w1")[2].splitlines()
        if "witness" in line
    ]
    assert witness_problems == []
    code, _, err = audit_verify(*args, "--witness-name", "someone.else/w9")
    assert code == 1 and "bears no cosignature of witness someone.else/w9" in err

    # A database restored from a backup of 8 leaves, that then grew to 12 with other runs' seals.
    with triggers_off():
        sql("DELETE FROM audit_lognode WHERE (index + 1) * (1 << level) > 8")
        sql("UPDATE audit_pendingseal SET leaf_index = NULL, seal_event_id = NULL WHERE leaf_index >= 8")
        sql("DELETE FROM audit_pendingseal WHERE leaf_index IS NULL")
    pending(4)
    seal_pending()
    code, out = witness()
    assert (
        code == 1 and "INCONSISTENT: the tree of 12 leaves does not extend the kept tree of 11 leaves" in out
    )
    code, _, err = audit_verify(*args, "--witness-name", "auditor.example/w1")
    assert code == 1 and "INCONSISTENT" in err


def test_a_log_that_shrank_or_a_note_of_another_key_is_named_by_the_witness(audit_files, tmp_path):
    pending(3)
    seal_pending()
    current = Checkpoint.objects.order_by("-number").first().note
    bigger = current.replace("\n3\n", "\n9\n", 1)
    kept = tmp_path / "kept.note"
    kept.write_text(
        note.sign(note.split(bigger)[0], note.tree_head(note.split(bigger)[0]).origin, signing.private_key())
    )
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("audit_witness", str(kept), stdout=out)
    assert "INCONSISTENT: the log shrank from 9 leaves (kept) to 3" in out.getvalue()

    other = Ed25519PrivateKey.generate()
    kept.write_text(note.sign(note.split(current)[0], note.tree_head(note.split(current)[0]).origin, other))
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("audit_witness", str(kept), stdout=out)
    assert "the kept checkpoint does not verify with the log's key" in out.getvalue()


def log_problems() -> list[str]:
    return [p.detail for p in verify(rows=False).problems if p.kind == "log"]


@pytest.mark.parametrize(
    "tamper, named",
    [
        ("DELETE FROM audit_lognode WHERE level = 0 AND index = 2", "leaf 2, the leaf of"),
        (
            "UPDATE audit_lognode SET hash = sha256('x') WHERE level = 0 AND index = 3",
            "leaf 3 is not the leaf of",
        ),
        (
            "UPDATE audit_lognode n SET hash = o.hash FROM audit_lognode o "
            "WHERE n.level = 0 AND o.level = 0 AND ((n.index = 1 AND o.index = 4) OR (n.index = 4 AND o.index = 1))",
            "leaf 1 is not the leaf of",
        ),
        (
            "INSERT INTO audit_lognode (level, index, hash) SELECT 0, 5, hash FROM audit_lognode WHERE level = 0 AND index = 0",
            "leaf 5 records no seal",
        ),
        (
            "UPDATE audit_lognode SET hash = sha256('y') WHERE level = 1 AND index = 1",
            "node 1 at level 1 is not the hash",
        ),
        ("DELETE FROM audit_lognode WHERE level = 2 AND index = 0", "node 0 at level 2 is gone"),
    ],
    ids=[
        "leaf removed",
        "leaf altered",
        "leaves reordered",
        "leaf duplicated",
        "node rewritten",
        "node removed",
    ],
)
def test_a_leaf_or_node_changed_behind_the_trigger_is_named(audit_files, tamper, named):
    pending(5)
    seal_pending()
    assert log_problems() == []
    with triggers_off():
        sql(tamper)
    problems = log_problems()
    assert any(named in p for p in problems), problems


def test_a_tree_rewritten_whole_is_caught_by_the_roots_it_signed(audit_files):
    pending(4)
    seal_pending()
    rows = list(PendingSeal.objects.order_by("leaf_index"))
    forged = [log.leaf_of(r) for r in rows]
    forged[1] = b"a seal that was never made"
    frontier: dict = {}
    with triggers_off():
        sql("DELETE FROM audit_lognode")
        for i, leaf in enumerate(forged):
            for (level, index), h in merkle.completed(i, merkle.leaf_hash(leaf), frontier):
                sql("INSERT INTO audit_lognode (level, index, hash) VALUES (%s, %s, %s)", [level, index, h])
    problems = log_problems()
    assert any("leaf 1 is not the leaf of" in p for p in problems)
    assert any(p.startswith("checkpoint 1 (") and "the tree was rewritten" in p for p in problems), problems
    assert any("audit.log_grown" in p and "the tree was rewritten" in p for p in problems), problems


@pytest.mark.parametrize(
    "edit", ["text edited", "truncated", "replaced by an older one", "signed by another key"]
)
def test_a_checkpoint_file_edited_is_named(audit_files, edit):
    pending(2)
    seal_pending()
    pending(1)
    seal_pending()
    first, second = Checkpoint.objects.order_by("number")
    path = audit_files.AUDIT_CHECKPOINT_DIR / second.file_name
    text = path.read_text()
    if edit == "text edited":
        path.write_text(text.replace("\n3\n", "\n2\n", 1))
    elif edit == "truncated":
        path.write_text(text[: len(text) // 2])
    elif edit == "replaced by an older one":
        path.write_text((audit_files.AUDIT_CHECKPOINT_DIR / first.file_name).read_text())
    else:
        origin = note.tree_head(note.split(text)[0]).origin
        path.write_text(note.sign(note.split(text)[0], origin, Ed25519PrivateKey.generate()))
    problems = [p.detail for p in verify(rows=False).problems]
    expected = {
        "text edited": "the signature does not hold with the trusted key",
        "truncated": "cannot be read",
        "replaced by an older one": "holds checkpoint 1: a file replaced by another one",
        "signed by another key": "the signature does not hold with the trusted key",
    }[edit]
    assert any(expected in p for p in problems), problems


def test_a_record_whose_only_checkpoint_was_removed_says_nothing_is_signed(audit_files, make_user):
    from audit.services import Actor, event_record
    from tests.audit.support import expected_hash

    ann = make_user("ann", Role.AUDITOR)
    from django.db import transaction

    with transaction.atomic():
        event = event_record(actor=Actor.for_user(ann), action="audit.exported", obj=ann)
    # An event from an hour ago (rehashed, so its chain holds), and no checkpoint at all.
    event.occurred_at = timezone.now() - timezone.timedelta(hours=1)
    with triggers_off():
        sql(
            "UPDATE audit_auditevent SET occurred_at = %s, hash = %s WHERE id = %s",
            [event.occurred_at, expected_hash(event), event.pk],
        )
    report = verify(rows=False)
    assert [p.kind for p in report.problems] == ["unsigned"], report.problems
    assert "NOTHING IS SIGNED" in report.problems[0].detail
    assert verify(rows=False, use_checkpoint=False).intact


def test_the_auditors_api_serves_the_note_and_proofs_that_check_offline(audit_files, make_user):
    pending(7)
    seal_pending()
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    response = client.get("/api/audit/log/checkpoint/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    head = note.opened(
        response.content.decode(),
        note.tree_head(note.split(response.content.decode())[0]).origin,
        signing.public_key(),
    )
    assert head.size == 7
    proof = client.get("/api/audit/log/consistency/", {"from": 3}).json()
    assert merkle.consistency_verify(3, 7, log.root(3), head.root, [bytes.fromhex(h) for h in proof["proof"]])
    assert client.get("/api/audit/log/consistency/").json()["proof"] == []  # the latest extends itself
    for bad in ({"from": 9}, {"from": "x"}, {"from": 2, "to": 8}, {"from": "-1"}):
        assert client.get("/api/audit/log/consistency/", bad).status_code == 400, bad


def test_a_tasks_runs_inclusion_proofs_check_offline_against_the_signed_note(finished_run, make_user):
    pending(4)  # the run is leaf 0 of a tree of 5
    seal_pending()
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    runs = client.get(f"/api/audit/tasks/{finished_run.task_id}/log/").json()["runs"]
    assert [r["run"] for r in runs] == [finished_run.pk]
    proof = runs[0]["log"]
    head = note.opened(
        proof["checkpoint"], note.tree_head(note.split(proof["checkpoint"])[0]).origin, signing.public_key()
    )
    assert (proof["leaf_index"], proof["tree_size"], head.size) == (0, 5, 5)
    path = [bytes.fromhex(h) for h in proof["audit_path"]]
    assert len(path) == 3 and merkle.inclusion_verify(
        0, 5, merkle.leaf_hash(proof["leaf"].encode()), path, head.root
    )
    tree = library_tree([log.leaf_of(r) for r in PendingSeal.objects.order_by("leaf_index")])
    assert library_includes(tree, 0, 5, proof["leaf"].encode(), path, head.root)
    assert client.get(f"/api/audit/tasks/{uuid.uuid4()}/log/").status_code == 404
