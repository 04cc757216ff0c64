"""Two document filters for code corpora, declared for Model Factory's filtered stage (`filters: {custom: [...]}`).

Each is a function of one document (a mapping: id, source, path, text, bytes, sha256, metadata) that says whether to
keep it; the factory runs it on its data engine's workers, so it must not depend on anything but the document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from factory.plugin import DocumentFilter

CONFLICT = re.compile(r"^(<{7}|>{7})( |$)", re.MULTILINE)
"""A line git writes around a merge conflict it could not resolve (`<<<<<<< HEAD`, `>>>>>>> branch`)."""
CELL = re.compile(r"^# (In|Out)\[[ 0-9]*\]:", re.MULTILINE)
"""A cell marker `jupyter nbconvert --to script` leaves (`# In[3]:`)."""
MAX_CELLS = 3


def no_merge_conflicts(document: Mapping[str, Any]) -> bool:
    """Keep a file unless it still holds conflict markers: half of it is one side's code, half the other's."""
    return CONFLICT.search(document["text"]) is None


def no_notebook_dumps(document: Mapping[str, Any]) -> bool:
    """Keep a file unless it is a notebook dumped to a script: more than `MAX_CELLS` cell markers, outputs pasted inline."""
    return len(CELL.findall(document["text"])) <= MAX_CELLS


NO_MERGE_CONFLICTS = DocumentFilter(name="no_merge_conflicts", keep=no_merge_conflicts,
                                    description="files with unresolved git merge-conflict markers")
NO_NOTEBOOK_DUMPS = DocumentFilter(name="no_notebook_dumps", keep=no_notebook_dumps,
                                   description="notebooks exported to scripts (more than 3 `# In[n]:` cell markers)")
