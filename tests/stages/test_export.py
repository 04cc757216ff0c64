"""The exported safetensors file: the same weights give the same bytes in every process."""

import subprocess
import sys

EXPORT = """
import hashlib
import numpy as np
from safetensors.numpy import load, save
from factory.models.export import sorted_header
weights = {"wte.weight": np.arange(6.0).reshape(2, 3), "ln_f.bias": np.ones(3)}
digests = set()
for _ in range(50):  # each save's map of metadata has keys of its own: its order differs within a process too
    data = sorted_header(save(weights, metadata={"tied_embeddings": "true", "format": "pt"}))
    assert all((load(data)[name] == array).all() for name, array in weights.items())
    digests.add(hashlib.sha256(data).hexdigest())
print(" ".join(sorted(digests)))
"""


def test_the_same_weights_export_the_same_bytes_in_every_process():
    # The library writes its metadata map in hash order, which differs between saves and between processes.
    said = [subprocess.run([sys.executable, "-c", EXPORT], capture_output=True, text=True, check=True).stdout.split() for _ in range(2)]
    assert len(said[0]) == 1 and said[0] == said[1]
