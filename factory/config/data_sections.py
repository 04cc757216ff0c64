"""The `data` section of an experiment file: datasets (where their documents come from, dedup, filters), the blend and how
training streams it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import (
    Field, ModelWrapValidatorHandler, PrivateAttr, SerializationInfo, ValidationError, field_validator, model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from factory.config.filter_kinds import document_filter
from factory.config.limits import MAX_BYTES
from factory.config.section import UNKNOWN_KEY, GrownSection, Section
from factory.config.source_kinds import SourceKind, source_kind
from factory.config.table_refs import DOCUMENT_COLUMNS, TABLE_PART, TAG_PATTERN, table_ref
from factory.errors import ConfigError, PluginError

DATASET_SHARDS = ("**/data-*.arrow",)
"""The files of a Hugging Face `datasets` dataset saved to disk: `save_to_disk` names its shards `data-<i>-of-<n>.arrow`."""


class SourceConfig(GrownSection):
    """Where the raw documents of one dataset come from. A kind a plugin adds may take fields of its own, written beside
    these (its `SourceKind.fields`)."""

    UNSET_LEFT_OUT = ("columns",)

    kind: str = "python-stdlib"
    """A registered source kind: `python-stdlib` (the running interpreter's standard library), `site-packages` (its
    installed packages), `directory` (`path`), `object-store` (`uri: s3://bucket/prefix`: the objects under it, copied
    into the source cache once per version of them), `iceberg` (`table: namespace.name`, `catalog`, `snapshot`: a snapshot
    of an Iceberg table, as Parquet parts in the source cache), or one a plugin package adds (`model_factory.sources`)."""
    path: str | None = None
    """For a kind that takes a path (`directory`): the directory to read, absolute or relative to the working directory."""
    include: tuple[str, ...] = ("**/*.py",)
    """Glob patterns, relative to the source root, of the files to read (format `arrow`, left out: `**/data-*.arrow`)."""
    exclude: tuple[str, ...] = ()
    """Glob patterns of files to leave out (caches are always left out)."""
    format: Literal["text", "jsonl", "parquet", "arrow"] = "text"
    """`text`: one document per file; `jsonl`: one document per line; `parquet`: one document per row (read with pyarrow);
    `arrow`: one document per row of Arrow IPC files, as a Hugging Face `datasets` dataset's `save_to_disk` writes them
    (`path` names the dataset's directory, or one split's; `include` left out reads its `data-*.arrow` shards, as
    `load_from_disk` does, and never the `cache-*.arrow` files beside them). A record's text is in `text_field`, or is
    rendered from the `columns` it keeps. A record file larger than `max_file_bytes` is skipped: raise it for large shards."""
    text_field: str = "text"
    """For records (`jsonl`, `parquet`, `arrow`) without `columns`: the key that holds the document text; the other keys
    become metadata."""
    columns: tuple[str, ...] = ()
    """For records (`jsonl`, `parquet`, `arrow`): keys of each record kept as columns of the dataset's tables (what `sft.data` maps), such
    as `[messages]` or `[prompt, completion]`. A value is text, or a list of `{role, content}` turns (stored as their
    JSON). The document's text, which dedup and the filters read, is the kept values joined in this order (turns: their
    contents joined by newlines); the other keys become metadata. A record missing a kept key, or holding another type,
    is skipped and counted. Empty: the text is in `text_field`. A dataset that keeps columns is left out of the default
    blend."""
    max_file_bytes: int = Field(1_000_000, gt=0, le=MAX_BYTES)
    """Files larger than this are left out (generated tables, not code)."""
    revision: str = ""
    """Free-form extra knob: changing it ingests the source again (its files' paths and contents are part of the raw
    stage's fingerprint already, so changed files are ingested again without it)."""

    _fields: Section | None = PrivateAttr(None)

    @property
    def fields(self) -> Section | None:
        """The fields the source's kind adds (an instance of its `SourceKind.fields`); None for a kind that adds none."""
        return self._fields

    @model_validator(mode="wrap")
    @classmethod
    def _kind_fields(cls, data: Any, handler: ModelWrapValidatorHandler[SourceConfig]) -> SourceConfig:
        """The keys that are not this section's are the kind's fields, read with its type; problems with either are
        reported together, each at its key."""
        kind = _kind_with_fields(data, cls.model_fields["kind"].default)
        if kind is None or kind.fields is None:
            return handler(data)  # a kind without fields: any other key is refused as unknown
        assert isinstance(data, dict), "a kind is only looked up in a mapping"
        own = {key: value for key, value in data.items() if key in cls.model_fields}
        theirs = {key: value for key, value in data.items() if key not in cls.model_fields}
        problems: list[InitErrorDetails] = []
        try:
            config = handler(own)
        except ValidationError as e:
            problems += _details(e, ())
        try:
            fields = kind.fields.model_validate(theirs)
        except ValidationError as e:
            problems += _details(e, sorted({*cls.model_fields, *kind.fields.model_fields}))
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        config._fields = fields
        return config

    def _dumped(self, data: dict[str, Any], info: SerializationInfo) -> dict[str, Any]:
        """The kind's fields are dumped beside the section's own, as they are written (and so enter the raw stage's fingerprint)."""
        data = super()._dumped(data, info)
        if self._fields is not None:
            data.update(self._fields.model_dump(mode=info.mode))
        return data

    @field_validator("kind")
    @classmethod
    def _kind_is_registered(cls, value: str) -> str:
        return registered(source_kind, value)

    @field_validator("columns")
    @classmethod
    def _columns_are_new_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not TABLE_PART.fullmatch(name) or name in DOCUMENT_COLUMNS:
                raise ValueError(f"column {name!r}: use lower_snake_case names other than the document's own "
                                 f"({', '.join(DOCUMENT_COLUMNS)})")
        if len(set(value)) != len(value):
            raise ValueError(f"columns {list(value)} name a column twice")
        return value

    @model_validator(mode="after")
    def _path_when_the_kind_takes_one(self) -> SourceConfig:
        kind = source_kind(self.kind)
        for name, value in kind.defaults.items():  # what the kind reads unless the file says otherwise
            if name in type(self).model_fields and name not in self.model_fields_set:
                object.__setattr__(self, name, value)  # written out in the config's dump, as if the file said it
        if self.format == "arrow" and "include" not in self.model_fields_set and "include" not in kind.defaults:
            object.__setattr__(self, "include", DATASET_SHARDS)
        if kind.takes_path and not self.path:
            raise ValueError(f"a {self.kind!r} source needs 'path'")
        if not kind.takes_path and self.path is not None:
            raise ValueError(f"'path' is only for a kind that takes one (directory); kind {self.kind!r} knows its own root")
        if self.columns and self.format == "text":
            raise ValueError("'columns' are keys of records: give format 'jsonl', 'parquet' or 'arrow'")
        return self


def registered(lookup: Callable[[str], Any], name: str) -> str:
    """`name`, when `lookup` (a registry's) finds it: an unknown name is this field's error, a broken plugin is not this
    file's fault and is said as such (PluginError)."""
    try:
        lookup(name)
    except PluginError:
        raise
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return name


def _kind_with_fields(data: Any, default: str) -> SourceKind | None:
    """The registered kind a source mapping names, None when it names none (its `kind` field says why); a PluginError when
    the kind's fields take names of the section's own."""
    name = data.get("kind", default) if isinstance(data, dict) else None
    if not isinstance(name, str):
        return None
    try:
        kind = source_kind(name)
    except PluginError:
        raise
    except ConfigError:
        return None
    if kind.fields is not None and (taken := sorted(set(kind.fields.model_fields) & set(SourceConfig.model_fields))):
        raise PluginError(f"{kind.origin}: source kind {kind.name!r} declares the fields {', '.join(taken)}, which every source "
                          "has already; rename them")
    return kind


def _details(error: ValidationError, allowed: Sequence[str]) -> list[InitErrorDetails]:
    """An error's problems as they are raised again; an unknown key says which keys are allowed (`allowed`, when given)."""
    details: list[InitErrorDetails] = []
    for problem in error.errors():
        if problem["type"] == "extra_forbidden" and allowed:
            kind = PydanticCustomError(UNKNOWN_KEY, "unknown key; allowed here: {allowed}", {"allowed": ", ".join(allowed)})
        else:
            kind = PydanticCustomError(problem["type"], problem["msg"])  # no context: the message as it is
        details.append({"type": kind, "loc": problem["loc"], "input": problem["input"]})
    return details


class DedupConfig(Section):
    """Duplicate removal; the first document in id order of each duplicate group is kept."""

    exact: bool = True
    """Drop documents whose bytes (sha256) equal an earlier document's."""
    near_threshold: float | None = Field(0.85, gt=0, le=1)
    """Estimated Jaccard similarity of token shingles above which a document is a near-duplicate (MinHash LSH); null turns it off."""
    num_perm: int = Field(128, ge=16, le=1024)
    """MinHash permutations: more is more precise and slower."""
    shingle_tokens: int = Field(5, ge=1, le=64)
    """Consecutive word tokens per shingle."""


class FiltersConfig(GrownSection):
    """Quality filters; each reports how many documents it removed."""

    UNSET_LEFT_OUT: ClassVar[tuple[str, ...]] = ("custom",)

    min_bytes: int = Field(1, ge=0, le=MAX_BYTES)
    """Documents shorter than this are dropped."""
    max_bytes: int | None = Field(None, gt=0, le=MAX_BYTES)
    """Documents longer than this are dropped (null: no bound)."""
    max_line_length: int | None = Field(None, gt=0, le=MAX_BYTES)
    """Documents with any line longer than this are dropped (minified or generated data)."""
    min_alnum_share: float = Field(0.0, ge=0, le=1)
    """Documents whose share of alphanumeric characters is below this are dropped."""
    drop_generated: bool = False
    """Drop files that say they are generated (`auto-generated`, `do not edit`, ... in the first lines)."""
    drop_license_only: bool = False
    """Drop files that are nothing but a license header (comments) and blank lines."""
    custom: tuple[str, ...] = ()
    """Filters installed packages declare (`factory.config.filter_kinds`), by name, applied in this order after the built-in
    ones, on the data engine's workers."""

    @field_validator("custom")
    @classmethod
    def _filters_are_registered(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            registered(document_filter, name)
        if len(set(value)) != len(value):
            raise ValueError(f"custom {list(value)} names a filter twice")
        return value


class DatasetConfig(Section):
    """One dataset: ingested raw, deduplicated, filtered; each step a versioned Iceberg table."""

    source: SourceConfig = SourceConfig()
    dedup: DedupConfig = DedupConfig()
    filters: FiltersConfig = FiltersConfig()
    tag: str | None = None
    """Version tag of the filtered table (default `v<n>`, the next number), given only when its checks pass; a tag names one version forever."""
    max_duplicate_share: float = Field(0.0, ge=0, le=1)
    """Asset check: the filtered table's share of exact duplicates must not exceed this, or training is blocked."""

    @field_validator("tag")
    @classmethod
    def _tag_is_a_name(cls, value: str | None) -> str | None:
        if value is not None and (not TAG_PATTERN.fullmatch(value) or value.startswith(("content-", "rejected-"))):
            raise ValueError(f"expected a tag of letters, digits, '.', '_', '-' (not starting with 'content-' or 'rejected-'), found {value!r}")
        return value


class BlendComponent(Section):
    """One part of the training mixture: a dataset of this file, or a pinned table version."""

    dataset: str | None = None
    """A dataset defined under `data.datasets`."""
    table: str | None = None
    """A table version pinned as `namespace.table@tag` (it must exist: `factory check` verifies)."""
    weight: float = Field(1.0, ge=0, le=1e6)
    """Relative share of documents drawn from this part."""
    mode: Literal["finite", "oversample"] = "oversample"
    """`finite`: each document at most once, then the part leaves the mix; `oversample`: repeat epochs as needed."""

    @model_validator(mode="after")
    def _one_origin(self) -> BlendComponent:
        if (self.dataset is None) == (self.table is None):
            raise ValueError("give exactly one of 'dataset' (defined in data.datasets) or 'table' ('namespace.table@tag')")
        if self.table is not None:
            table_ref(self.table)
        return self

    @property
    def label(self) -> str:
        """How the part is named in reports."""
        return self.dataset or self.table or ""


class DataConfig(Section):
    """Datasets, the blend training streams from, and how it streams."""

    datasets: dict[str, DatasetConfig] = {"stdlib": DatasetConfig()}
    """Datasets by name (lower_snake_case); each becomes tables `raw.<name>`, `dedup.<name>`, `filtered.<name>`."""
    blend: tuple[BlendComponent, ...] = ()
    """The training mixture (default: every dataset that keeps no row `columns`, equal weights)."""
    validation_percent: int = Field(5, ge=1, le=50)
    """Share of documents (by hash of id) held out for validation."""
    packing: Literal["best-fit", "next-fit"] = "best-fit"
    """How documents are packed into fixed-length sequences."""
    shuffle_buffer_docs: int = Field(1024, ge=1, le=10_000_000)
    """Documents shuffled together as they stream in."""
    pack_window_docs: int = Field(64, ge=1, le=1_000_000)
    """Documents packed together: a wider window fills sequences better."""

    @field_validator("datasets")
    @classmethod
    def _dataset_names(cls, value: dict[str, DatasetConfig]) -> dict[str, DatasetConfig]:
        for name in value:
            if not TABLE_PART.fullmatch(name):
                raise ValueError(f"dataset name {name!r}: use lower_snake_case (it names Iceberg tables)")
        return value

    @model_validator(mode="after")
    def _blend_is_valid(self) -> DataConfig:
        if not self.blend:
            if not self.datasets:
                raise ValueError("define at least one dataset under 'datasets' or a 'blend' of pinned tables")
            documents = [name for name, dataset in self.datasets.items() if not dataset.source.columns]  # rows are for sft.data
            # Empty when every dataset keeps columns: the experiment refuses that unless it starts from a model made elsewhere.
            object.__setattr__(self, "blend", tuple(BlendComponent(dataset=name) for name in documents))
        for part in self.blend:
            if part.dataset is not None and part.dataset not in self.datasets:
                known = ", ".join(sorted(self.datasets)) or "none"
                raise ValueError(f"blend names dataset {part.dataset!r}, which is not defined; datasets: {known}")
        if self.blend and sum(part.weight for part in self.blend) <= 0:
            raise ValueError("blend weights are all zero: give at least one part a positive weight")
        return self
