"""Sentinels of the rows' columns that the drafting stage writes and the tables store (no torch: the report reads them).

    NOT_A_TREE   tree_node of a row that is not a tree's (the chain's, a drafter's, a what-if head's); written as null
"""

NOT_A_TREE = -128
