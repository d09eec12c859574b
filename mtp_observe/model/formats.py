"""The what-if head precisions by name (`replay --head-precision`, run.json whatifs.head_precision, the positions
table's head_precision column): a vocabulary the run writes and the report checks, with no torch behind it.
What each one stores and how its round trip is computed: precisions.py and quantisers.py.
"""

PRECISIONS = ("bf16", "fp8", "int8", "nvfp4", "q8_0", "q6_k", "q4_k")
