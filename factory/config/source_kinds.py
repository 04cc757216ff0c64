"""Source kinds: where a dataset's raw files come from (`data.datasets.<name>.source.kind`), built in or from a plugin.

A `SourceKind` names a directory of files; the source's `include`/`exclude` globs pick the files in it, which the
raw stage lists (their digest enters its fingerprint) and reads (as text or JSON lines). The built-in kinds are the
running interpreter's standard library, its site-packages, a directory the file names (`path`, under the data
roots), the objects under a prefix of an object store (`uri: s3://bucket/prefix`), copied into the source cache, and a
snapshot of an Iceberg table (`table`, in a catalog pyiceberg is configured with), written there as Parquet parts.
An installed package adds a kind through the entry-point group `model_factory.sources`, each entry point naming a
`SourceKind`: e.g. a team's shared corpus mounted at a fixed place, a tool's cache directory, or a commit of a git
repository (`examples/git-source`). A kind may add fields of its own to the `source` mapping (`SourceKind.fields`)
and check them before anything is read (`SourceKind.check`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator

from factory.config.plugins import load_declarations, plugin_name, unknown
from factory.config.section import Section
from factory.errors import ConfigError, FactoryError, PluginError

ENTRY_POINT_GROUP = "model_factory.sources"
BUILT_IN = "built in"


class _DataPathMarker:
    """Marks a field of a source kind's `fields` as a path to data (see `DataPath`)."""

    def __repr__(self) -> str:
        return "DataPath"


DataPath = Annotated[str, _DataPathMarker()]
"""The type of a source kind's field that names a file or directory to read (absolute, or relative to the working
directory): like `directory`'s `path`, it must lie under the data roots, which the factory checks before the kind's
`check` runs and before the source is read."""


@dataclass(frozen=True, kw_only=True)
class SourceKind:
    """One kind of source: the directory its files are read from, and the fields it adds to the `source` mapping.

    A kind with `fields` (a `Section` type) reads them from the `source` mapping itself, beside `kind`, `include` and the
    others: `source: {kind: git, repo: data/lib, commit: 3f2a9c1}`. The experiment file's validation reads them with that
    type, so an unknown key or a wrong value is refused at its `file:line`, and they enter the raw stage's fingerprint
    (built-in kinds add none, so their recipes keep their fingerprints). `root` and `check` read them as `source.fields`,
    an instance of that type:

        def root(source: SourceConfig) -> Path:
            fields: GitFields = source.fields
            sha = resolve(fields)  # the full sha of the pinned commit
            return source_cache("git", sha, lambda directory: unpack(Path(fields.repo), sha, directory))

    A field typed `DataPath` is kept under the data roots by the factory. `check(fields)` says, by raising
    `ConfigError("<field>: what is wrong; what to change")`, why the source cannot be read here; `factory check` reports it
    at the `source` section's `file:line`, and it runs again before the source is listed or read (plan, the raw stage).
    Anything else `check` or `root` raises is reported in one line as the plugin's fault (`PluginError`).
    """

    name: str
    """What `source.kind` says."""
    description: str
    """What it reads, shown in `factory check`'s errors and the reference."""
    root: Callable[[Any], Path]
    """The directory to read, given the source's config (a `SourceConfig`; its kind's fields are `source.fields`). A kind
    that materialises the directory (unpacks an archive or a commit) keeps it in `source_cache`."""
    takes_path: bool = False
    """Whether `source.path` names the directory (then required, and only directories under the data roots are read)."""
    skip_dirs: frozenset[str] = frozenset()
    """Directories never walked into (caches are always skipped)."""
    fields: type[Section] | None = None
    """The kind's own fields of the `source` mapping (a `Section`: frozen, unknown keys refused), or None for none. Their
    names must differ from `SourceConfig`'s own (`kind`, `path`, `include`, ...)."""
    check: Callable[[Any], None] | None = None
    """`check(fields)`: raises `ConfigError` saying what to change when the source cannot be read here (run by `factory
    check`, and before the source is listed or read); None: nothing to check beyond the fields' types."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """What a source of this kind reads when its file leaves these of the `source` mapping's own fields out (`format`,
    `include`, ...): e.g. `{"format": "parquet", "include": ("*.parquet",)}` for a kind that writes Parquet files."""
    origin: str = BUILT_IN
    """Who declared it: `built in`, or the plugin's entry point and package (set by the registry)."""

    def checked(self, fields: Section | None) -> None:
        """Run `check` on a source's fields: its ConfigError as it is, anything else as a PluginError naming the plugin."""
        if self.check is not None and fields is not None:
            self._as_plugin_error("check", self.check, fields)

    def root_of(self, source: Any) -> Path:
        """The directory a source of this kind reads (`root`): what else than a factory error it raises is the plugin's fault."""
        return self._as_plugin_error("root", self.root, source)

    def _as_plugin_error(self, what: str, function: Callable[[Any], Any], argument: Any) -> Any:
        try:
            return function(argument)
        except FactoryError:
            raise
        except Exception as e:  # a plugin's function can fail in any way: one line naming it, never a traceback
            raise PluginError(f"{self.origin}: the {what} of source kind {self.name!r} failed ({type(e).__name__}: {e}); "
                              "fix the plugin or uninstall it") from e


def data_path_fields(fields: type[Section]) -> tuple[str, ...]:
    """The fields of a kind's `fields` typed `DataPath`."""
    return tuple(name for name, info in fields.model_fields.items() if any(isinstance(m, _DataPathMarker) for m in info.metadata))


def _path(config: Any) -> Path:
    assert config.path is not None, "a source that takes a path has one (SourceConfig validates it)"
    return Path(config.path)


def glob_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a glob over relative posix paths: `**/` spans directories (or none), `*` and `?` stay within one."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            body = body.replace("\\", "\\\\")
            body = "^" + body[1:] if body.startswith("!") else "\\" + body if body.startswith("^") else body
            out.append("[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def selected_by(source: Any) -> Callable[[str], bool]:
    """Whether a relative path is one the source reads: matched by an `include` glob and by no `exclude` glob."""
    include = [glob_pattern(p) for p in source.include]
    exclude = [glob_pattern(p) for p in source.exclude]
    return lambda rel: any(p.fullmatch(rel) for p in include) and not any(p.fullmatch(rel) for p in exclude)


class StoreFields(Section):
    """The prefix an `object-store` source reads."""

    uri: str
    """The objects to read, under a prefix of an object store: `s3://bucket/prefix` (the endpoint, region and credentials
    from the standard AWS variables, as for `FACTORY_STORE`). Their keys below the prefix are the paths `include` and
    `exclude` match."""


def _store_uri(fields: StoreFields) -> None:
    from factory.storage import BACKENDS

    scheme, separator, _ = fields.uri.partition("://")
    if not separator or scheme == "file" or scheme not in BACKENDS:
        known = ", ".join(f"{name}://" for name in BACKENDS if name != "file")
        raise ConfigError(f"uri: {fields.uri!r} is not an object store's prefix: write {known}bucket/prefix (files on this "
                          "machine are a source of kind `directory`)")


def _store_root(source: Any) -> Path:
    """The objects under the source's prefix that its globs match, copied into the source cache once per set of ETags (a
    changed object has another ETag: another copy is made, and the raw stage runs again)."""
    from factory.config.source_cache import source_cache
    from factory.storage import open_store

    fields: StoreFields = source.fields
    store = open_store(fields.uri, setting="source.uri")
    selected = selected_by(source)
    versions = {key: etag for key, etag in store.versions().items() if selected(key)}
    listing = hashlib.sha256("".join(f"{key}\0{etag}\n" for key, etag in versions.items()).encode()).hexdigest()[:32]

    def fill(directory: Path) -> None:
        for key in versions:
            (directory / key).parent.mkdir(parents=True, exist_ok=True)
            store.download(key, directory / key)

    return source_cache("object-store", listing, fill)


class TableFields(Section):
    """The Iceberg table an `iceberg` source reads."""

    catalog: str = "default"
    """The catalog's name, configured as pyiceberg configures catalogs (`~/.pyiceberg.yaml`, or variables such as
    `PYICEBERG_CATALOG__<NAME>__URI` and `__WAREHOUSE`): where it is and its credentials stay out of the experiment file."""
    table: str
    """The table, `namespace.name`."""
    snapshot: int | None = Field(None, gt=0)
    """The snapshot to read (its id); left out: the table's current snapshot when the stage is planned (a new snapshot
    makes the raw stage run again, as a changed file does)."""

    @field_validator("table")
    @classmethod
    def _namespaced(cls, value: str) -> str:
        if not re.fullmatch(r"[^.\s]+(\.[^.\s]+)+", value):
            raise ValueError(f"{value!r} is not a table's full name: write namespace.name")
        return value


PART_ROWS_SHARE = 4
"""An `iceberg` source's part files hold rows whose Arrow size adds up to at most a quarter of `max_file_bytes` (Parquet
is smaller than Arrow in memory: a part stays within the bound the raw stage reads files under)."""


def _table_root(source: Any) -> Path:
    """The rows of the table's snapshot, written as Parquet parts into the source cache, keyed by the table's identity and
    the snapshot: the rows as the table's scan gives them (deletes applied), in parts the raw stage reads as files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.exceptions import NoSuchTableError

    from factory.config.source_cache import source_cache

    fields: TableFields = source.fields
    try:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.utils.config import Config

        # read now, not as pyiceberg read it when first imported: a long-lived process sees the configuration of today
        catalog = load_catalog(fields.catalog, **(Config().get_catalog_config(fields.catalog) or {}))
        table = catalog.load_table(fields.table)
    except NoSuchTableError as e:
        raise ConfigError(f"source.table: catalog {fields.catalog!r} has no table {fields.table!r}; check its name") from e
    except (ValueError, OSError, ImportError) as e:  # no such catalog configured, or one that cannot be reached
        raise ConfigError(f"source.catalog: pyiceberg cannot open the catalog {fields.catalog!r} ({e}); configure it in "
                          "~/.pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__URI") from e
    snapshot = table.snapshot_by_id(fields.snapshot) if fields.snapshot is not None else table.current_snapshot()
    if snapshot is None and fields.snapshot is None:
        raise ConfigError(f"source.table: table {fields.table!r} holds no snapshot yet (nothing was ever written to it)")
    if snapshot is None:
        known = ", ".join(str(s.snapshot_id) for s in table.snapshots()[-5:])
        raise ConfigError(f"source.snapshot: table {fields.table!r} has no snapshot {fields.snapshot}; its newest: {known}")
    key = hashlib.sha256(f"{table.metadata.table_uuid}\0{snapshot.snapshot_id}\0{source.max_file_bytes}".encode()).hexdigest()[:32]

    def fill(directory: Path) -> None:
        budget = max(source.max_file_bytes // PART_ROWS_SHARE, 1)
        part: list[pa.RecordBatch] = []
        written = size = 0

        def write() -> None:  # without statistics: a text column's would hold its smallest and largest texts again
            nonlocal part, written, size
            pq.write_table(pa.Table.from_batches(part), directory / f"part-{written:05d}.parquet", write_statistics=False)
            part, written, size = [], written + 1, 0

        for batch in table.scan(snapshot_id=snapshot.snapshot_id).to_arrow_batch_reader():
            rows = max(1, batch.num_rows * budget // max(batch.nbytes, 1))
            for start in range(0, batch.num_rows, rows):
                piece = batch.slice(start, rows)
                if part and size + piece.nbytes > budget:
                    write()
                part.append(piece)
                size += piece.nbytes
        if part:
            write()

    return source_cache("iceberg", key, fill)


BUILTIN_SOURCES = (
    SourceKind(name="python-stdlib", description="the running interpreter's standard library",
               root=lambda config: Path(sysconfig.get_paths()["stdlib"]), skip_dirs=frozenset({"site-packages", "dist-packages"})),
    SourceKind(name="site-packages", description="the running interpreter's installed packages",
               root=lambda config: Path(sysconfig.get_paths()["purelib"])),
    SourceKind(name="directory", description="a directory, named by `path`", root=_path, takes_path=True),
    SourceKind(name="object-store", description="the objects under a prefix of an object store, named by `uri` (s3://bucket/prefix)",
               root=_store_root, fields=StoreFields, check=_store_uri),
    SourceKind(name="iceberg", description="the rows of a snapshot of an Iceberg table (`table`, `catalog`, `snapshot`)",
               root=_table_root, fields=TableFields, defaults={"format": "parquet", "include": ("*.parquet",)}),
)


@functools.cache
def source_kinds() -> dict[str, SourceKind]:
    """Every registered source kind by name: the built-in ones, then the plugins'."""
    kinds = {kind.name: kind for kind in BUILTIN_SOURCES}
    for entry, declared in load_declarations(ENTRY_POINT_GROUP, SourceKind, "source kind"):
        if (clash := kinds.get(declared.name)) is not None:
            raise PluginError(f"{plugin_name(entry)} declares the source kind {declared.name!r}, which {clash.origin} declares already; "
                              "rename one of them")
        if declared.fields is not None and not (isinstance(declared.fields, type) and issubclass(declared.fields, Section)):
            raise PluginError(f"{plugin_name(entry)} gives the source kind {declared.name!r} fields of {declared.fields!r}, not a "
                              "Section subclass; declare them as `class MyFields(Section)` from factory.plugin")
        kinds[declared.name] = SourceKind(**{**declared.__dict__, "origin": plugin_name(entry)})
    return kinds


def source_kind(name: str) -> SourceKind:
    """The source kind named `name`; a ConfigError listing the known ones otherwise. A built-in kind is found without
    loading the plugins (the schema's defaults are built when it is imported)."""
    for kind in BUILTIN_SOURCES:
        if kind.name == name:
            return kind
    kinds = source_kinds()
    if name not in kinds:
        raise unknown(ENTRY_POINT_GROUP, "source kind", name, kinds)
    return kinds[name]
