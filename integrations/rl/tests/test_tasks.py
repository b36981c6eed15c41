"""Task sources: R2E-Gym and SWE-bench rows, JSONL files, image manifests,
and the refusals of malformed input (no hub needed)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from sandhub_rl import (
    ImageListSource,
    JsonlSource,
    Task,
    TaskSourceError,
    load_image_list,
    load_tasks,
    swebench_image,
    to_tasks,
)

SWE_ROW = {
    "instance_id": "django__django-11099",
    "repo": "django/django",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "problem_statement": "UsernameValidator allows trailing newline",
    "version": "3.0",
    "FAIL_TO_PASS": "[]",
}
R2E_ROW = {
    "repo_name": "orange3",
    "commit_hash": "9764be4fa30b1ae85db3b875039f0a2983531a9d",
    "docker_image": "namanjain12/orange3_final:9764be4fa30b1ae85db3b875039f0a2983531a9d",
    "problem_statement": "Crash on empty table",
    "expected_output_json": "{}",
}


def test_swebench_image_follows_the_harness_convention() -> None:
    assert swebench_image("django__django-11099") == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert swebench_image("Astropy__Astropy-1", namespace="", arch="arm64", tag="v2") == (
        "sweb.eval.arm64.astropy_1776_astropy-1:v2"
    )


def test_swebench_rows_get_their_instance_image() -> None:
    [task] = to_tasks([SWE_ROW])
    assert task.id == "django__django-11099"
    assert task.image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert task.template is None
    assert task.data["problem_statement"] == SWE_ROW["problem_statement"]


def test_r2e_gym_rows_use_docker_image_and_repo_at_commit() -> None:
    [task] = to_tasks([R2E_ROW])
    assert task.image == R2E_ROW["docker_image"]
    assert task.id == "orange3@9764be4fa30b1ae85db3b875039f0a2983531a9d"
    legacy = {**R2E_ROW, "image_name": R2E_ROW["docker_image"]}
    del legacy["docker_image"]
    assert to_tasks([legacy])[0].image == R2E_ROW["docker_image"]


def test_a_row_image_beats_the_swebench_convention() -> None:
    row = {**SWE_ROW, "docker_image": "swebench/swesmith.x86_64.pallets_1776_click.fde47b4b"}
    assert to_tasks([row])[0].image == row["docker_image"]


def test_fields_named_explicitly() -> None:
    rows = [{"name": "a", "img": "reg/a:1"}, {"name": "b", "img": "reg/b:1"}]
    tasks = load_tasks(rows, image_field="img", id_field="name")
    assert [(t.id, t.image) for t in tasks] == [("a", "reg/a:1"), ("b", "reg/b:1")]
    with pytest.raises(TaskSourceError, match="row 2: no image in 'img'"):
        load_tasks([rows[0], {"name": "c"}], image_field="img", id_field="name")


def test_template_rows_and_setup() -> None:
    rows = [{"id": "t1", "template": "py", "setup": ["echo a > a", "echo b"]}, {"id": "t2"}]
    tasks = to_tasks(rows, template="default", setup=["git clean -fd"])
    assert tasks[0].template == "py" and tasks[0].image is None
    assert tasks[0].setup == ("git clean -fd", "echo a > a", "echo b")
    assert tasks[1].template == "default"


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([{"id": "a"}], "row 1: no image"),
        ([["not", "a", "row"]], "row 1: a row must be a JSON object"),
        ([{"problem_statement": "x"}], "row 1: no task id"),
        ([{"id": "a", "image": "r/a:1"}, {"id": "a", "image": "r/b:1"}], "row 2: duplicate task id 'a'"),
        ([{"id": "a", "image": "has space:1"}], "row 1: .*not an image reference"),
        ([{"id": "a", "image": "r/a:1", "setup": [1]}], "row 1: `setup` must be"),
    ],
)
def test_malformed_rows_are_refused_with_their_place(rows: list, match: str) -> None:
    with pytest.raises(TaskSourceError, match=match):
        to_tasks(rows)


def test_task_validation() -> None:
    with pytest.raises(TaskSourceError, match="exactly one of image and template"):
        Task(id="x")
    with pytest.raises(TaskSourceError, match="exactly one of image and template"):
        Task(id="x", image="a:1", template="t")
    with pytest.raises(TaskSourceError, match="non-empty string"):
        Task(id="", image="a:1")
    assert Task(id="x", template="t", setup="echo hi").setup == ("echo hi",)
    assert Task(id="x", template="t").source == "template:t"
    # hashable despite its dict fields: trainers key dicts by task
    task = Task(id="x", template="t", data={"a": [1]}, env={"A": "1"})
    assert {task: 1}[Task(id="x", template="t", data={"a": [1]}, env={"A": "1"})] == 1


def test_jsonl_source_and_load_tasks_from_files(tmp_path: Path) -> None:
    path = tmp_path / "swe.jsonl"
    rows = [{**SWE_ROW, "instance_id": f"astropy__astropy-{n}"} for n in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    source = JsonlSource(path)
    tasks = source.tasks()
    assert [t.id for t in tasks] == [r["instance_id"] for r in rows]
    assert [t.id for t in source] == [t.id for t in load_tasks(path)]
    assert len(source.images()) == 5
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(rows))
    assert [t.id for t in load_tasks(array)] == [t.id for t in tasks]
    with path.open("a") as f:  # a source re-reads its file
        f.write(json.dumps({**SWE_ROW, "instance_id": "sympy__sympy-1"}) + "\n")
    assert len(source.tasks()) == 6


def test_bad_files_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(SWE_ROW) + "\n{not json\n")
    with pytest.raises(TaskSourceError, match=r"bad.jsonl:2: not JSON"):
        load_tasks(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(TaskSourceError, match=r"bad.jsonl:1: a row must be a JSON object, not list"):
        JsonlSource(path).tasks()
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TaskSourceError, match="not UTF-8"):
        load_tasks(path)
    with pytest.raises(TaskSourceError, match="No such file"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "obj.json").write_text("{}")
    with pytest.raises(TaskSourceError, match="must hold an array"):
        load_tasks(tmp_path / "obj.json")
    with pytest.raises(TaskSourceError, match="not one row"):
        load_tasks(SWE_ROW)  # type: ignore[arg-type]


def test_image_lists(tmp_path: Path) -> None:
    text = tmp_path / "images.txt"
    text.write_text("# SWE-bench lite\nreg/a:1\n\n  reg/b:1  \nreg/a:1\n")
    assert load_image_list(text) == ["reg/a:1", "reg/b:1"]
    assert list(ImageListSource(text)) == ["reg/a:1", "reg/b:1"] and len(ImageListSource(text)) == 2
    array = tmp_path / "images.json"
    array.write_text(json.dumps(["reg/c:1", {"docker_image": "reg/d:1"}]))
    assert load_image_list(array) == ["reg/c:1", "reg/d:1"]
    jsonl = tmp_path / "images.jsonl"
    jsonl.write_text(json.dumps({"image": "reg/e:1"}) + "\n" + json.dumps({"image_name": "reg/f:1"}) + "\n")
    assert load_image_list(jsonl) == ["reg/e:1", "reg/f:1"]
    assert load_image_list(["reg/g:1", {"image": "reg/g:1"}]) == ["reg/g:1"]
    text.write_text("reg/a:1\nnot an image\n")
    with pytest.raises(TaskSourceError, match=r"images.txt:2: 'not an image' is not an image reference"):
        load_image_list(text)
    with pytest.raises(TaskSourceError, match="no image field"):
        load_image_list([{"name": "x"}])


def test_errors_pickle() -> None:
    err = TaskSourceError("bad", "f.jsonl:3")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.where == "f.jsonl:3"
