"""Uploading item sets: each bad row refused with its line and reason and nothing kept; splits made
once, seeded and stratified by kind; a version frozen on first use, and what is added after goes into
the next; an export that uploads again to the same content hash."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from audit.models import AuditEvent
from audit.services import Actor
from training.errors import TrainingError
from training.itemsets import rows as item_rows
from training.itemsets.rows import FileRefused, read_file
from training.itemsets.selectors import resolve, split_ids
from training.itemsets.services import assign_splits, items_upload, manifest_of, version_freeze, version_lines
from training.models import Item, ItemSet, ItemSetVersion

pytestmark = pytest.mark.django_db
ACTOR = Actor.service("test")


def jsonl(*rows: dict) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def upload(name: str, content: bytes, filename: str = "items.jsonl") -> ItemSetVersion:
    version, _ = items_upload(
        name=name,
        rows=read_file(content, filename),
        filename=filename,
        content_sha256=hashlib.sha256(content).hexdigest(),
        actor=ACTOR,
    )
    return version


def refused(content: bytes, filename: str = "items.jsonl") -> list[tuple[int, str]]:
    with pytest.raises(FileRefused) as caught:
        read_file(content, filename)
    return caught.value.errors


def test_each_bad_row_is_named_by_its_line_and_reason():
    content = (
        b'{"id": "a", "text": "What is 2+2?", "reference": "4", "scorer": "numeric"}\n'
        b'{"id": "b", "text": "Name a colour.", "reference": "blue", "scorer": "numeric"}\n'
        b'{"id": "a", "text": "Again"}\n'
        b"not json\n"
        b'{"id": "c", "text": "bell\\u0007"}\n'
        b'{"id": "d/../e", "text": "x"}\n'
        b'{"id": "f", "text": "x", "colour": "red"}\n'
        b'{"id": "g", "text": "x", "data_class": "secret"}\n'
        b'{"id": "h", "text": "x", "reference": "(", "scorer": "regex"}\n'
        b'{"id": "i", "text": "x", "scorer": "exact"}\n'
    )
    errors = dict(refused(content))
    assert "cannot read the reference 'blue'" in errors[2]
    assert "on line 1 already" in errors[3]
    assert errors[4].startswith("not JSON")
    assert "U+0007" in errors[5]
    assert "is not 1 to 80 characters" in errors[6]
    assert "unknown column(s) colour" in errors[7]
    assert "unknown data_class 'secret'" in errors[8]
    assert "regex" in errors[9]
    assert "needs a reference" in errors[10]
    assert 1 not in errors


def test_a_file_in_another_encoding_or_without_its_columns_is_refused():
    assert refused("id,text\nq,Caf\u00e9\n".encode("latin-1"), "items.csv") == [
        (2, "not UTF-8 (byte 0xe9); save the file as UTF-8")
    ]
    assert "lacks the column(s) text" in refused(b"id,question\nq,What?\n", "items.csv")[0][1]
    assert refused(b"", "items.jsonl") == [(0, "the file has no items")]
    big = jsonl({"id": "big", "text": "x" * (item_rows.MAX_FILE_BYTES + 1)})
    assert "at most" in refused(big)[0][1] and refused(big)[0][0] == 0


def test_a_text_over_the_task_limit_is_refused_like_a_submission(settings):
    settings.CONDUCTOR_MAX_TASK_CHARS = 100
    errors = refused(jsonl({"id": "long", "text": "y" * 101}))
    assert errors == [(1, "At most 100 characters. The task text has 101.")]


def test_csv_with_formulas_and_markup_is_kept_as_text_and_shown_escaped(page, mira):
    content = (
        b"id,text,reference,scorer,kind\n"
        b'x1,"=HYPERLINK(""http://evil"")",1,numeric,sheet\n'
        b"x2,<script>alert(1)</script> What is 1+1?,2,numeric,sheet\n"
    )
    version = upload("hostile", content, "hostile.csv")
    texts = set(version.items.values_list("text", flat=True))
    assert '=HYPERLINK("http://evil")' in texts
    body = page.get(f"/training/itemsets/{version.item_set.name}/").content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_a_refused_upload_through_the_page_keeps_nothing_and_names_the_line(page):
    bad = jsonl(
        {"id": "ok", "text": "fine", "reference": "1", "scorer": "numeric"}, {"id": "ok", "text": "dup"}
    )
    response = page.post(
        "/training/itemsets/upload/",
        {"name": "team", "file": SimpleUploadedFile("items.jsonl", bad, "application/jsonl")},
    )
    assert response.status_code == 400
    assert "line 2: the id &#x27;ok&#x27; is on line 1 already" in response.content.decode()
    assert not ItemSet.objects.exists() and not Item.objects.exists()
    good = jsonl({"id": "ok", "text": "fine", "reference": "1", "scorer": "numeric"})
    response = page.post(
        "/training/itemsets/upload/", {"name": "team", "file": SimpleUploadedFile("a.jsonl", good)}
    )
    assert response.status_code == 302 and response["Location"] == "/training/itemsets/team/"
    event = AuditEvent.objects.get(action="itemset.items_added")
    assert event.actor_name == "mira" and event.payload["file_sha256"] == hashlib.sha256(good).hexdigest()


def test_the_api_and_the_template(api, page):
    template = page.get("/training/itemsets/template.csv")
    assert template.status_code == 200
    rows = read_file(template.content, "t.csv")
    assert [r.key for r in rows] == ["q-1", "q-2"]
    content = jsonl(
        *(
            {"id": f"n{i}", "text": f"{i} + 1?", "reference": str(i + 1), "scorer": "numeric"}
            for i in range(5)
        )
    )
    made = api.post(
        "/api/training/itemsets/",
        {"name": "via-api", "file": SimpleUploadedFile("n.jsonl", content)},
        format="multipart",
    )
    assert made.status_code == 201, made.content
    assert made.json()["added"] == 5
    bad = api.post(
        "/api/training/itemsets/",
        {"name": "via-api", "file": SimpleUploadedFile("n.jsonl", b"{]\n")},
        format="multipart",
    )
    assert bad.status_code == 400 and "line 1: not JSON" in bad.json()["detail"]
    detail = api.get("/api/training/itemsets/via-api/").json()
    assert detail["versions"][0]["items"] == 5
    assert api.get("/api/training/itemsets/via-api/items/").json()["results"][0]["id"] == "n0"


def test_splits_are_made_once_stratified_by_kind_and_seeded():
    new = [
        item_rows.ItemRow(i, f"k{i}", "t", None, "auto", kind, "internal", "")
        for i, kind in enumerate(["a"] * 10 + ["b"] * 5)
    ]
    from training.itemsets.services import NewItem

    items = [NewItem.of_row(r) for r in new]
    splits = assign_splits(items, [], seed=0)
    assert splits == assign_splits(items, [], seed=0)  # seeded
    by_kind = {k: [s for i, s in zip(items, splits, strict=True) if i.kind == k] for k in ("a", "b")}
    assert sorted(by_kind["a"]) == ["dev"] * 2 + ["test"] * 2 + ["train"] * 6
    assert sorted(by_kind["b"]) == ["dev", "test", "train", "train", "train"]
    assert splits != assign_splits(items, [], seed=1)  # another seed, another draw


def test_a_version_is_frozen_on_first_use_and_later_items_make_the_next():
    first = jsonl(
        *(
            {"id": f"q{i}", "text": f"q{i}?", "reference": "1", "scorer": "numeric", "kind": "k"}
            for i in range(10)
        )
    )
    version = upload("grows", first)
    splits = dict(version.items.values_list("key", "split"))
    frozen = version_freeze(version=version, actor=ACTOR, why="test")
    used = resolve("grows", split_ids("grows", "train"))
    assert used.version.pk == frozen.pk
    later = upload(
        "grows", jsonl({"id": "q10", "text": "new?", "reference": "2", "scorer": "numeric", "kind": "k"})
    )
    assert later.number == 2 and not later.frozen
    assert later.items.count() == 11 and frozen.items.count() == 10
    assert {k: s for k, s in later.items.values_list("key", "split") if k != "q10"} == splits  # split once
    frozen.refresh_from_db()
    assert manifest_of(frozen)["content_hash"] == frozen.content_hash  # what the job started on
    with pytest.raises(TrainingError, match="already in grows: q1"):
        upload("grows", jsonl({"id": "q1", "text": "again", "reference": "1", "scorer": "numeric"}))


def test_an_export_uploads_again_to_the_same_content_hash(page):
    content = jsonl(
        *(
            {
                "id": f"e{i}",
                "text": f"Caf\u00e9 {i}\u2028?",
                "reference": str(i),
                "scorer": "numeric",
                "kind": "k",
            }
            for i in range(7)
        ),
        {
            "id": "h",
            "text": "judged by people",
            "scorer": "human",
            "kind": "k2",
            "data_class": "confidential",
        },
    )
    version = upload("roundtrip", content)
    exported = b"".join(page.get("/training/itemsets/roundtrip/items.jsonl").streaming_content)
    assert exported.decode().split("\n")[:-1] == list(version_lines(version))
    again = upload("roundtrip-copy", exported)
    assert manifest_of(again)["content_hash"] == manifest_of(version)["content_hash"]
    manifest = json.loads(page.get("/training/itemsets/roundtrip/manifest.json").content)
    assert manifest["items"] == 8 and manifest["content_hash"] == manifest_of(version)["content_hash"]
    assert AuditEvent.objects.filter(action="itemset.exported").count() == 1
