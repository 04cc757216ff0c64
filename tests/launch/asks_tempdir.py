"""Imported by a warm interpreter in the tests: asks for the temporary directory as it is imported, as torch's import does
(`tempfile` keeps the answer for the rest of the process)."""

import tempfile

ASKED = tempfile.gettempdir()
