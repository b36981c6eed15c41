"""Task sources: what an episode runs in, read from datasets and manifests.

A :class:`Task` names the sandbox it needs (an ``image`` or a hub
``template``), the ``setup`` commands that prepare it, and carries the
dataset row as ``data`` for the trainer's prompt and reward.

Rows come from JSONL files or any iterable of dicts. Two public shapes are
understood without configuration:

- **R2E-Gym** rows carry the image in ``docker_image`` (older dumps:
  ``image_name``); their id is ``instance_id`` when present, else
  ``{repo_name}@{commit_hash}``.
- **SWE-bench** rows (``instance_id``, ``repo``, ``base_commit``,
  ``problem_statement``...) name no image; the evaluation harness's own
  convention gives it: ``{namespace}/sweb.eval.{arch}.{id}:{tag}``, the id
  lower-cased with ``__`` replaced by ``_1776_`` (Docker repository names
  may not hold ``__``), e.g. ``swebench/sweb.eval.x86_64.django_1776_django-11099:latest``.
  Rows that already carry ``docker_image``/``image_name`` (SWE-Gym,
  SWE-smith and friends) use that instead.

Image manifests (:func:`load_image_list`) list images to pre-pull or warm:
one reference per line (``#`` comments), a JSON array, or JSONL rows.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from .errors import TaskSourceError

__all__ = [
    "Task",
    "ImageListSource",
    "JsonlSource",
    "load_image_list",
    "load_tasks",
    "swebench_image",
    "to_tasks",
]

#: Fields that hold a row's image, in the order they are tried.
IMAGE_FIELDS = ("docker_image", "image_name", "image")
#: Fields that hold a row's id, in the order they are tried.
ID_FIELDS = ("instance_id", "task_id", "id")

# An image reference as the hub accepts it (api: 1-255 of [A-Za-z0-9._-/:@]).
_IMAGE_RE = re.compile(r"^[A-Za-z0-9._/:@-]{1,255}$")
# Files bigger than this are refused as task sources: a typo'd path to a
# multi-gigabyte blob should fail, not fill memory.
MAX_MANIFEST_BYTES = 1 << 30


@dataclass(frozen=True)
class Task:
    """One episode's environment.

    Exactly one of ``image`` (an OCI reference; the fleet maps it to a hub
    template) and ``template`` (a hub template name) is set. ``setup`` runs
    in order after the sandbox is ready (``/bin/sh -c``; a non-zero exit fails
    the acquire), after ``files`` (workspace-relative path -> content) are
    written. ``env`` is the sandbox's environment (it forces a cold start on
    the hub: warm sandboxes were started without it). ``data`` is the source
    row, untouched."""

    id: str
    image: str | None = None
    template: str | None = None
    setup: tuple[str, ...] = ()
    files: Mapping[str, str | bytes] = field(default_factory=dict, hash=False)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    data: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TaskSourceError(f"a task id must be a non-empty string, not {self.id!r}")
        if (self.image is None) == (self.template is None):
            raise TaskSourceError(f"task {self.id}: name exactly one of image and template")
        if self.image is not None and not _IMAGE_RE.match(self.image):
            raise TaskSourceError(f"task {self.id}: {self.image!r} is not an image reference")
        if self.template is not None and not (isinstance(self.template, str) and self.template):
            raise TaskSourceError(f"task {self.id}: template must be a non-empty string")
        if isinstance(self.setup, str):
            object.__setattr__(self, "setup", (self.setup,))
        else:
            object.__setattr__(self, "setup", tuple(self.setup))
        if not all(isinstance(c, str) and c for c in self.setup):
            raise TaskSourceError(f"task {self.id}: setup commands must be non-empty strings")

    @property
    def source(self) -> str:
        """``image:<ref>`` or ``template:<name>``: what the sandbox is made from."""
        return f"image:{self.image}" if self.image is not None else f"template:{self.template}"


def swebench_image(instance_id: str, *, namespace: str = "swebench", arch: str = "x86_64", tag: str = "latest") -> str:
    """The SWE-bench harness's instance image for ``instance_id``.

    >>> swebench_image("django__django-11099")
    'swebench/sweb.eval.x86_64.django_1776_django-11099:latest'
    """
    key = instance_id.lower().replace("__", "_1776_")
    prefix = f"{namespace}/" if namespace else ""
    return f"{prefix}sweb.eval.{arch}.{key}:{tag}"


def _looks_swebench(row: Mapping[str, Any]) -> bool:
    return all(isinstance(row.get(k), str) and row.get(k) for k in ("instance_id", "repo", "base_commit"))


def _row_id(row: Mapping[str, Any], id_field: str | None, where: str) -> str:
    if id_field is not None:
        value = row.get(id_field)
        if value is None or value == "":
            raise TaskSourceError(f"no {id_field!r} in the row", where)
        return str(value)
    for name in ID_FIELDS:
        value = row.get(name)
        if value is not None and value != "":
            return str(value)
    if row.get("repo_name") and row.get("commit_hash"):  # R2E-Gym
        return f"{row['repo_name']}@{row['commit_hash']}"
    raise TaskSourceError(f"no task id (tried {', '.join(ID_FIELDS)}, repo_name@commit_hash)", where)


def _row_image(
    row: Mapping[str, Any], image_field: str | None, where: str, swebench_namespace: str
) -> str | None:
    if image_field is not None:
        value = row.get(image_field)
        if not isinstance(value, str) or not value:
            raise TaskSourceError(f"no image in {image_field!r}", where)
        return value
    for name in IMAGE_FIELDS:
        value = row.get(name)
        if isinstance(value, str) and value:
            return value
    if _looks_swebench(row):
        return swebench_image(row["instance_id"], namespace=swebench_namespace)
    return None


def _row_setup(row: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = row.get("setup")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(c, str) for c in value):
        return tuple(value)
    raise TaskSourceError("`setup` must be a string or a list of strings", where)


def to_tasks(
    rows: Iterable[Mapping[str, Any]],
    *,
    image_field: str | None = None,
    id_field: str | None = None,
    template: str | None = None,
    setup: Sequence[str] = (),
    swebench_namespace: str = "swebench",
    source: str = "rows",
) -> list[Task]:
    """Tasks from R2E-Gym-, SWE-bench- or otherwise-shaped rows.

    ``image_field``/``id_field`` name the fields to read instead of guessing.
    A row's own ``template`` field (or the ``template`` argument, for rows
    with no image) names a hub template instead of an image. ``setup`` runs
    before each row's own ``setup``. Duplicate ids are refused: a trainer
    keys results by task id."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for n, row in enumerate(rows, 1):
        where = f"{source} row {n}"
        if not isinstance(row, Mapping):
            raise TaskSourceError(f"a row must be a JSON object, not {type(row).__name__}", where)
        task_id = _row_id(row, id_field, where)
        if task_id in seen:
            raise TaskSourceError(f"duplicate task id {task_id!r}", where)
        seen.add(task_id)
        row_template = row.get("template")
        image = None if isinstance(row_template, str) and row_template and image_field is None else _row_image(
            row, image_field, where, swebench_namespace
        )
        tmpl = None
        if image is None:
            tmpl = row_template if isinstance(row_template, str) and row_template else template
            if tmpl is None:
                raise TaskSourceError(
                    f"no image (tried {', '.join(IMAGE_FIELDS)}, the SWE-bench convention) and no template", where
                )
        try:
            tasks.append(
                Task(
                    id=task_id,
                    image=image,
                    template=tmpl,
                    setup=(*setup, *_row_setup(row, where)),
                    data=dict(row),
                )
            )
        except TaskSourceError as e:
            raise TaskSourceError(e.message, where) from None
    return tasks


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise TaskSourceError(f"{size} bytes is more than a task source may hold ({MAX_MANIFEST_BYTES})", str(path))
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskSourceError(f"not UTF-8 text ({e.reason} at byte {e.start})", str(path)) from None
    except OSError as e:
        raise TaskSourceError(e.strerror or str(e), str(path)) from None


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskSourceError(f"not JSON ({e.msg} at column {e.colno})", f"{path}:{n}") from None
        if not isinstance(row, dict):
            raise TaskSourceError(f"a row must be a JSON object, not {type(row).__name__}", f"{path}:{n}")
        yield row


def _file_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` file, or of a ``.json`` file holding an array."""
    if path.suffix == ".json":
        try:
            data = json.loads(_read_text(path))
        except json.JSONDecodeError as e:
            raise TaskSourceError(f"not JSON ({e.msg} at line {e.lineno})", str(path)) from None
        if not isinstance(data, list):
            raise TaskSourceError("a .json task file must hold an array of rows", str(path))
        return data
    return list(_jsonl_rows(path))


class JsonlSource:
    """A JSONL file of task rows (read when iterated, every time).

    ``JsonlSource("swe.jsonl").tasks()`` is ``load_tasks("swe.jsonl")``; the
    source object is what a trainer keeps to re-read an appended file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        image_field: str | None = None,
        id_field: str | None = None,
        template: str | None = None,
        setup: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.image_field, self.id_field, self.template, self.setup = image_field, id_field, template, tuple(setup)

    def __repr__(self) -> str:
        return f"JsonlSource({str(self.path)!r})"

    def tasks(self) -> list[Task]:
        """Every row as a :class:`Task` (errors name the file and line)."""
        return to_tasks(
            _jsonl_rows(self.path),
            image_field=self.image_field,
            id_field=self.id_field,
            template=self.template,
            setup=self.setup,
            source=str(self.path),
        )

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks())

    def images(self) -> list[str]:
        """The distinct images the tasks need, in first-use order."""
        return _distinct(t.image for t in self.tasks() if t.image is not None)


def load_tasks(
    path_or_rows: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    image_field: str | None = None,
    id_field: str | None = None,
    template: str | None = None,
    setup: Sequence[str] = (),
) -> list[Task]:
    """Tasks from a ``.jsonl`` (or ``.json`` array) file, or from rows already
    in memory (e.g. a ``datasets.Dataset``, which iterates as dicts)."""
    if isinstance(path_or_rows, (str, os.PathLike)):
        path = Path(path_or_rows)
        return to_tasks(
            _file_rows(path), image_field=image_field, id_field=id_field, template=template, setup=setup,
            source=str(path),
        )
    if isinstance(path_or_rows, Mapping):
        raise TaskSourceError("load_tasks takes a path or an iterable of rows, not one row")
    return to_tasks(path_or_rows, image_field=image_field, id_field=id_field, template=template, setup=setup)


def _distinct(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _manifest_entry(value: Any, where: str) -> str:
    if isinstance(value, Mapping):
        for name in IMAGE_FIELDS:
            if isinstance(value.get(name), str) and value[name]:
                value = value[name]
                break
        else:
            raise TaskSourceError(f"no image field ({', '.join(IMAGE_FIELDS)})", where)
    if not isinstance(value, str) or not _IMAGE_RE.match(value):
        raise TaskSourceError(f"{value!r} is not an image reference", where)
    return value


def load_image_list(path_or_items: str | os.PathLike[str] | Iterable[Any]) -> list[str]:
    """Distinct image references (first-use order) from a manifest: a text
    file with one per line (blank lines and ``#`` comments skipped), a JSON
    array (of strings or rows), or JSONL rows; or an iterable of the same."""
    if not isinstance(path_or_items, (str, os.PathLike)):
        return _distinct(_manifest_entry(v, f"item {n}") for n, v in enumerate(path_or_items, 1))
    path = Path(path_or_items)
    text = _read_text(path)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskSourceError(f"not JSON ({e.msg} at line {e.lineno})", str(path)) from None
        return _distinct(_manifest_entry(v, f"{path} item {n}") for n, v in enumerate(data, 1))
    out: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{n}"
        if line.startswith("{"):
            try:
                out.append(_manifest_entry(json.loads(line), where))
            except json.JSONDecodeError as e:
                raise TaskSourceError(f"not JSON ({e.msg})", where) from None
        else:
            out.append(_manifest_entry(line, where))
    return _distinct(out)


class ImageListSource:
    """An image manifest file (see :func:`load_image_list`), re-read on each use."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"ImageListSource({str(self.path)!r})"

    def images(self) -> list[str]:
        return load_image_list(self.path)

    def __iter__(self) -> Iterator[str]:
        return iter(self.images())

    def __len__(self) -> int:
        return len(self.images())
