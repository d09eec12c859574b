"""The suffix tree of suffix decoding: Arctic Inference's `SuffixTree`, ported to numba over numpy arrays.

Followed (Apache-2.0): snowflakedb/ArcticInference at commit 9d4643881608178f0f58a33d1b61919ca246997f,
`csrc/suffix_decoding/suffix_tree.{h,cc}` — `append` (its cases 1a, 1b, 2a, 2b, 3a, 3b),
`remove`, `_match_context`, `_speculate_path`, `speculate`, and the sibling/group list
maintenance (`_increment_count`, `_decrement_count`, `_remove_from_siblings`,
`_insert_into_siblings_before/after`, `_replace_in_siblings`) statement by statement, because
the order of equal-count siblings — which child `_speculate_path` follows on a tie — is decided
there and nowhere else.

What the tree holds: for every sequence and every start i, the suffix seq[i : i + max_depth],
path-compressed (a node is a run of tokens all suffixes through it share). count(node) = the
number of suffixes passing through or ending at it = occurrences of its path string. A node's
children are kept in a list of non-increasing count; equal counts form groups, and the position of
a node inside its group follows from the history of increments (a node that gains a count moves
to the front of the next group up when it sat just behind it, else to the back of that group) —
reproduced here exactly.

Differences of representation only (the answers are the same):
  * nodes and groups are rows of int32 arrays, pointers are row indices (-1 = null); children
    are one hash map per tree keyed (node, token) (`hashmap`); every sequence's tokens live in one
    buffer and a node's reference is a position in it;
  * a removed sequence's tokens stay in the buffer, so references into it stay valid and
    `remove`'s re-pointing of references (and the `endpoints` maps kept for it) is not needed —
    a reference only serves to read a node's tokens, which are the same at every occurrence; case
    1a, which relies on the re-pointing (it extends a leaf by the sequence's next token), sets the
    leaf's reference to the current sequence itself;
  * only the sequence being appended has active nodes (sequences are appended one after another);
  * nothing is freed: a removed subtree's rows and hash-map entries stay, unreachable, and groups
    are never reclaimed (C++ frees them with their last node) — the public corpus's 554k output
    tokens take about 240 MB of global tree, spare capacity included;
  * optionally, every write is journaled so the tree can be rolled back to an earlier length of
    its sequence (the per-request tree of consecutive requests sharing a prefix), and `append`
    stops when an array is nearly full so the caller can grow it (compiled code cannot).

Arithmetic as in C++: probabilities are float32 (`prob *= (float)count / parent_count`), the score
is their float32 sum, and the length limit is `(int)(match_len * factor + offset + 1e-6)` with the
product and the offset in float32 and the 1e-6 in double.
"""

from __future__ import annotations

import numpy as np

from . import hashmap
from .hashmap import compiled, compiled_inline

# node fields (int32 columns)
COUNT, TOKEN, LENGTH, REF, PARENT, HEAD, TAIL, NEXT, PREV, GROUP, NCHILD = range(11)
NF = 11
# group fields
G_HEAD, G_NEXT, G_PREV = range(3)
GF = 3
# meta fields (int64)
(M_NODES, M_GROUPS, M_BUF, M_SEQ_START, M_SEQ_LEN, M_RING_HEAD, M_RING_SIZE, M_MAP, M_JOURNAL, M_JOURNAL_ON,
 M_DEPTH, M_STEP_NODES, M_STEP_GROUPS) = range(13)
MF = 13
# journal codes: (code, index, old value)
J_NODE, J_GROUP, J_META, J_RING, J_MAP_INSERTED, J_MAP_ERASED, J_MAP_SET = range(7)
J_PER_ACTIVE = 48  # more journal entries than one active node's step can write
ROOT = 0


def new_tree(max_depth: int, journal: bool, nodes: int = 1024, tokens: int = 1024):
    """An empty tree: the tuple of arrays the compiled functions take (see `grown` for its parts)."""
    assert max_depth >= 1
    node = np.full((nodes, NF), -1, dtype=np.int32)
    node[ROOT] = -1
    node[ROOT, COUNT] = 0
    node[ROOT, LENGTH] = 0
    node[ROOT, NCHILD] = 0
    group = np.full((nodes, GF), -1, dtype=np.int32)
    meta = np.zeros(MF, dtype=np.int64)
    meta[M_NODES] = 1
    meta[M_DEPTH] = max_depth
    meta[M_JOURNAL_ON] = 1 if journal else 0
    ring = np.zeros(max_depth, dtype=np.int32)
    buf = np.zeros(tokens, dtype=np.int32)
    keys, values = hashmap.empty(2 * nodes)
    journal_rows = np.zeros((4096 if journal else 1, 3), dtype=np.int64)
    return (node, group, meta, ring, buf, keys, values, journal_rows)


def grown(t, tokens: int = 1):
    """The tree with room for at least `tokens` more appends' worst case (arrays doubled as needed)."""
    node, group, meta, ring, buf, keys, values, journal = t
    depth = int(meta[M_DEPTH])
    per = tokens * (depth + 2)
    if meta[M_NODES] + per > node.shape[0]:
        node = _grow_rows(node, meta[M_NODES] + per, -1)
    if meta[M_GROUPS] + 2 * per > group.shape[0]:
        group = _grow_rows(group, meta[M_GROUPS] + 2 * per, -1)
    if meta[M_BUF] + tokens > buf.shape[0]:
        buf = _grow_rows(buf, meta[M_BUF] + tokens, 0)
    keys, values = hashmap.grown(keys, values, int(meta[M_MAP]), 2 * per)
    if meta[M_JOURNAL_ON] and meta[M_JOURNAL] + tokens * depth * J_PER_ACTIVE + 64 > journal.shape[0]:
        journal = _grow_rows(journal, meta[M_JOURNAL] + tokens * depth * J_PER_ACTIVE + 64, 0)
    return (node, group, meta, ring, buf, keys, values, journal)


def _grow_rows(a: np.ndarray, need: int, fill: int) -> np.ndarray:
    rows = max(int(need), 2 * a.shape[0])
    out = np.full((rows,) + a.shape[1:], fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@compiled
def room(t) -> bool:
    """Room for one more append's worst case."""
    node, group, meta, ring, buf, keys, values, journal = t
    depth = meta[M_DEPTH]
    return (meta[M_NODES] + depth + 2 <= node.shape[0] and meta[M_GROUPS] + 2 * depth + 4 <= group.shape[0]
            and meta[M_BUF] + 1 <= buf.shape[0] and 2 * (meta[M_MAP] + 2 * depth + 2) <= keys.shape[0]
            and (meta[M_JOURNAL_ON] == 0 or meta[M_JOURNAL] + depth * J_PER_ACTIVE + 64 <= journal.shape[0]))


# ---------------------------------------------------------------------------------------------
# Journaled writes


@compiled_inline
def _log(t, code, index, old):
    meta = t[2]
    journal = t[7]
    j = meta[M_JOURNAL]
    journal[j, 0] = code
    journal[j, 1] = index
    journal[j, 2] = old
    meta[M_JOURNAL] = j + 1


@compiled_inline
def nset(t, i, f, v):
    node = t[0]
    meta = t[2]
    if node[i, f] == v:
        return  # not a change: nothing to journal
    if meta[M_JOURNAL_ON] != 0 and i < meta[M_STEP_NODES]:
        _log(t, J_NODE, i * NF + f, node[i, f])
    node[i, f] = v


@compiled_inline
def gset(t, g, f, v):
    group = t[1]
    meta = t[2]
    if group[g, f] == v:
        return
    if meta[M_JOURNAL_ON] != 0 and g < meta[M_STEP_GROUPS]:
        _log(t, J_GROUP, g * GF + f, group[g, f])
    group[g, f] = v


@compiled_inline
def mset(t, f, v):
    meta = t[2]
    if meta[M_JOURNAL_ON] != 0:
        _log(t, J_META, f, meta[f])
    meta[f] = v


@compiled_inline
def rset(t, slot, v):
    ring = t[3]
    meta = t[2]
    if ring[slot] == v:
        return
    if meta[M_JOURNAL_ON] != 0:
        _log(t, J_RING, slot, ring[slot])
    ring[slot] = v


@compiled_inline
def _key(parent, token):
    return (np.int64(parent) << np.int64(31)) | np.int64(token)


@compiled_inline
def child_of(t, n, token):
    return hashmap.get(t[5], t[6], _key(n, token))


@compiled
def map_insert(t, n, token, c):
    key = _key(n, token)
    meta = t[2]
    if meta[M_JOURNAL_ON] != 0:
        _log(t, J_MAP_INSERTED, key, 0)
    hashmap.put(t[5], t[6], key, c)
    mset(t, M_MAP, meta[M_MAP] + 1)


@compiled
def map_set(t, n, token, c):
    """Overwrite an existing entry."""
    key = _key(n, token)
    meta = t[2]
    if meta[M_JOURNAL_ON] != 0:
        _log(t, J_MAP_SET, key, hashmap.get(t[5], t[6], key))
    hashmap.put(t[5], t[6], key, c)


@compiled
def map_erase(t, n, token):
    key = _key(n, token)
    meta = t[2]
    if meta[M_JOURNAL_ON] != 0:
        _log(t, J_MAP_ERASED, key, hashmap.get(t[5], t[6], key))
    hashmap.erase(t[5], t[6], key)
    mset(t, M_MAP, meta[M_MAP] - 1)


@compiled
def undo(t, length):
    """Undo every journaled write after the journal's first `length` entries, newest first."""
    node, group, meta, ring, buf, keys, values, journal = t
    meta[M_JOURNAL_ON] = 0
    for j in range(meta[M_JOURNAL] - 1, length - 1, -1):
        code = journal[j, 0]
        index = journal[j, 1]
        old = journal[j, 2]
        if code == J_NODE:
            node[index // NF, index % NF] = old
        elif code == J_GROUP:
            group[index // GF, index % GF] = old
        elif code == J_META:
            meta[index] = old
        elif code == J_RING:
            ring[index] = old
        elif code == J_MAP_INSERTED:
            hashmap.erase(keys, values, index)
        else:  # erased or overwritten: put the old value back
            hashmap.put(keys, values, index, old)
    meta[M_JOURNAL] = length
    meta[M_JOURNAL_ON] = 1


@compiled
def _new_node(t, count, token, length, ref):
    node = t[0]
    meta = t[2]
    n = meta[M_NODES]
    mset(t, M_NODES, n + 1)
    node[n, :] = -1
    node[n, COUNT] = count
    node[n, TOKEN] = token
    node[n, LENGTH] = length
    node[n, REF] = ref
    node[n, NCHILD] = 0
    return n


@compiled
def _new_group(t, head):
    group = t[1]
    meta = t[2]
    g = meta[M_GROUPS]
    mset(t, M_GROUPS, g + 1)
    group[g, G_HEAD] = head
    group[g, G_NEXT] = -1
    group[g, G_PREV] = -1
    return g


# ---------------------------------------------------------------------------------------------
# Sibling lists (suffix_tree.cc, the functions of the same names)


@compiled
def _remove_from_siblings(t, n):
    node = t[0]
    group = t[1]
    g = node[n, GROUP]
    if group[g, G_HEAD] == n:
        nxt = node[n, NEXT]
        if nxt != -1 and node[nxt, COUNT] == node[n, COUNT]:
            gset(t, g, G_HEAD, nxt)  # others remain in the group: the next one heads it
            nset(t, n, GROUP, -1)
        else:  # the only member: the group leaves the list with the node (which keeps it)
            if group[g, G_PREV] != -1:
                gset(t, group[g, G_PREV], G_NEXT, group[g, G_NEXT])
            if group[g, G_NEXT] != -1:
                gset(t, group[g, G_NEXT], G_PREV, group[g, G_PREV])
            gset(t, g, G_PREV, -1)
            gset(t, g, G_NEXT, -1)
    else:
        nset(t, n, GROUP, -1)
    parent = node[n, PARENT]
    if node[n, NEXT] != -1:
        nset(t, node[n, NEXT], PREV, node[n, PREV])
    else:
        nset(t, parent, TAIL, node[n, PREV])
    if node[n, PREV] != -1:
        nset(t, node[n, PREV], NEXT, node[n, NEXT])
    else:
        nset(t, parent, HEAD, node[n, NEXT])
    nset(t, n, PREV, -1)
    nset(t, n, NEXT, -1)


@compiled
def _insert_before(t, n, other):
    node = t[0]
    parent = node[n, PARENT]
    if node[other, PREV] != -1:
        nset(t, node[other, PREV], NEXT, n)
    else:
        nset(t, parent, HEAD, n)
    nset(t, n, NEXT, other)
    nset(t, n, PREV, node[other, PREV])
    nset(t, other, PREV, n)
    prev = node[n, PREV]
    if prev != -1 and node[n, COUNT] == node[prev, COUNT]:
        nset(t, n, GROUP, node[prev, GROUP])
    elif node[n, COUNT] == node[other, COUNT]:
        nset(t, n, GROUP, node[other, GROUP])
        gset(t, node[n, GROUP], G_HEAD, n)
    else:
        g = node[n, GROUP]
        if g == -1:
            g = _new_group(t, n)
            nset(t, n, GROUP, g)
        if prev != -1:
            gset(t, g, G_PREV, node[prev, GROUP])
            gset(t, node[prev, GROUP], G_NEXT, g)
        gset(t, g, G_NEXT, node[other, GROUP])
        gset(t, node[other, GROUP], G_PREV, g)


@compiled
def _insert_after(t, n, other):
    node = t[0]
    group = t[1]
    parent = node[n, PARENT]
    if node[other, NEXT] != -1:
        nset(t, node[other, NEXT], PREV, n)
    else:
        nset(t, parent, TAIL, n)
    nset(t, n, PREV, other)
    nset(t, n, NEXT, node[other, NEXT])
    nset(t, other, NEXT, n)
    nxt = node[n, NEXT]
    if nxt != -1 and node[n, COUNT] == node[nxt, COUNT]:
        nset(t, n, GROUP, node[nxt, GROUP])
        if group[node[n, GROUP], G_HEAD] == nxt:
            gset(t, node[n, GROUP], G_HEAD, n)
    elif node[n, COUNT] == node[other, COUNT]:
        nset(t, n, GROUP, node[other, GROUP])
    else:
        g = node[n, GROUP]
        if g == -1:
            g = _new_group(t, n)
            nset(t, n, GROUP, g)
        if nxt != -1:
            gset(t, g, G_NEXT, node[nxt, GROUP])
            gset(t, node[nxt, GROUP], G_PREV, g)
        gset(t, g, G_PREV, node[other, GROUP])
        gset(t, node[other, GROUP], G_NEXT, g)


@compiled
def _replace_in_siblings(t, old, new):
    node = t[0]
    group = t[1]
    parent = node[old, PARENT]
    if node[old, NEXT] != -1:
        nset(t, node[old, NEXT], PREV, new)
    else:
        nset(t, parent, TAIL, new)
    if node[old, PREV] != -1:
        nset(t, node[old, PREV], NEXT, new)
    else:
        nset(t, parent, HEAD, new)
    nset(t, new, PREV, node[old, PREV])
    nset(t, new, NEXT, node[old, NEXT])
    nset(t, old, PREV, -1)
    nset(t, old, NEXT, -1)
    g = node[old, GROUP]
    if group[g, G_HEAD] == old:
        gset(t, g, G_HEAD, new)
    nset(t, new, GROUP, g)
    nset(t, old, GROUP, -1)


@compiled
def _increment_count(t, n):
    node = t[0]
    group = t[1]
    if node[n, PARENT] == -1:
        nset(t, n, COUNT, node[n, COUNT] + 1)
        return
    prev = node[n, PREV]
    if prev == -1 or node[prev, COUNT] > node[n, COUNT] + 1:
        nxt = node[n, NEXT]
        if nxt == -1 or node[nxt, COUNT] < node[n, COUNT]:
            nset(t, n, COUNT, node[n, COUNT] + 1)  # alone in its group, stays
        else:  # splits off its group into a new one in front of it
            orig = node[n, GROUP]
            gset(t, orig, G_HEAD, nxt)
            g = _new_group(t, n)
            gset(t, g, G_NEXT, orig)
            if group[orig, G_PREV] != -1:
                gset(t, g, G_PREV, group[orig, G_PREV])
                gset(t, group[orig, G_PREV], G_NEXT, g)
            gset(t, orig, G_PREV, g)
            nset(t, n, GROUP, g)
            nset(t, n, COUNT, node[n, COUNT] + 1)
    else:  # moves in front of the head of the group before it
        other = group[node[prev, GROUP], G_HEAD]
        _remove_from_siblings(t, n)
        nset(t, n, COUNT, node[n, COUNT] + 1)
        _insert_before(t, n, other)


@compiled
def _decrement_count(t, n):
    node = t[0]
    group = t[1]
    if node[n, PARENT] == -1:
        nset(t, n, COUNT, node[n, COUNT] - 1)
        return
    nxt = node[n, NEXT]
    c = node[n, COUNT]
    if nxt == -1 or node[nxt, COUNT] < c - 1:
        prev = node[n, PREV]
        if prev == -1 or node[prev, COUNT] > c:
            nset(t, n, COUNT, c - 1)
        else:  # splits off its group into a new one behind it
            orig = node[n, GROUP]
            g = _new_group(t, n)
            gset(t, g, G_PREV, orig)
            if group[orig, G_NEXT] != -1:
                gset(t, g, G_NEXT, group[orig, G_NEXT])
                gset(t, group[orig, G_NEXT], G_PREV, g)
            gset(t, orig, G_NEXT, g)
            nset(t, n, GROUP, g)
            nset(t, n, COUNT, c - 1)
    elif node[nxt, COUNT] == c - 1:  # joins the next group as its head
        gset(t, node[nxt, GROUP], G_HEAD, n)
        g = node[n, GROUP]
        if group[g, G_HEAD] == n:
            if group[g, G_PREV] != -1:
                gset(t, group[g, G_PREV], G_NEXT, group[g, G_NEXT])
            gset(t, group[g, G_NEXT], G_PREV, group[g, G_PREV])
        nset(t, n, GROUP, node[nxt, GROUP])
        nset(t, n, COUNT, c - 1)
    else:  # moves to the head of the next group
        other_group = group[node[n, GROUP], G_NEXT]
        _remove_from_siblings(t, n)
        nset(t, n, COUNT, c - 1)
        if other_group == -1:
            _insert_after(t, n, node[node[n, PARENT], TAIL])
        else:
            _insert_before(t, n, group[other_group, G_HEAD])


# ---------------------------------------------------------------------------------------------
# append, start/remove a sequence


@compiled
def start_sequence(t):
    """The next appends go to a new sequence (the previous one keeps its tokens and suffixes)."""
    meta = t[2]
    mset(t, M_SEQ_START, meta[M_BUF])
    mset(t, M_SEQ_LEN, 0)
    mset(t, M_RING_HEAD, 0)
    mset(t, M_RING_SIZE, 0)


@compiled
def append(t, token):
    """SuffixTree::append for the current sequence (the caller checked `room`)."""
    node, group, meta, ring, buf, keys, values, journal = t
    meta[M_STEP_NODES] = meta[M_NODES]
    meta[M_STEP_GROUPS] = meta[M_GROUPS]
    depth = meta[M_DEPTH]
    # a new active suffix at the root; at most max_depth of them
    head = meta[M_RING_HEAD]
    size = meta[M_RING_SIZE]
    if size == depth:
        head = (head + 1) % depth
        size -= 1
        mset(t, M_RING_HEAD, head)
    rset(t, (head + size) % depth, ROOT)
    size += 1
    mset(t, M_RING_SIZE, size)
    nset(t, ROOT, COUNT, node[ROOT, COUNT] + 1)
    at = meta[M_BUF]  # buffer position of the new token
    buf[at] = token
    mset(t, M_BUF, at + 1)
    mset(t, M_SEQ_LEN, meta[M_SEQ_LEN] + 1)
    seq_end = at + 1  # buffer position after the current sequence
    for r in range(size):
        slot = (head + r) % depth
        n = ring[slot]
        child = child_of(t, n, token)
        if child == -1:
            _append_new(t, slot, n, token, at, seq_end)
        elif node[n, COUNT] == node[child, COUNT] + 1 and n != ROOT:
            _append_through(t, slot, n, child, token, seq_end)
        else:
            _append_into(t, slot, n, child, token, at)


@compiled_inline
def _append_new(t, slot, n, token, at, seq_end):
    """append's case 1, for the active suffix at ring slot `slot` (node n): no child of n starts with the token."""
    node = t[0]
    if node[n, COUNT] == 1 and n != ROOT:
        # 1a: only this suffix passes here, a leaf: it grows by the token
        nset(t, n, LENGTH, node[n, LENGTH] + 1)
        nset(t, n, REF, seq_end - node[n, LENGTH])
    else:
        # 1b: a new leaf child, last among its siblings
        c = _new_node(t, 1, token, 1, at)
        node[c, PARENT] = n
        map_insert(t, n, token, c)
        nset(t, n, NCHILD, node[n, NCHILD] + 1)
        if node[n, NCHILD] == 1:
            nset(t, n, HEAD, c)
            nset(t, n, TAIL, c)
            node[c, GROUP] = _new_group(t, c)
        else:
            _insert_after(t, c, node[n, TAIL])
        rset(t, slot, c)


@compiled_inline
def _append_through(t, slot, n, child, token, seq_end):
    """append's case 2: every other suffix through n goes on into child (its first token is the token)."""
    node, buf = t[0], t[4]
    # 2: every other suffix through n goes on into child
    if node[child, LENGTH] == 1:
        # 2a: n and child become one node
        nset(t, child, COUNT, node[child, COUNT] + 1)
        nset(t, child, TOKEN, node[n, TOKEN])
        nset(t, child, LENGTH, node[n, LENGTH] + 1)
        nset(t, child, REF, seq_end - node[child, LENGTH])
        nset(t, child, PARENT, node[n, PARENT])
        _replace_in_siblings(t, n, child)
        map_set(t, node[n, PARENT], node[child, TOKEN], child)
        map_erase(t, n, token)  # n is gone (C++ frees it with its children map)
        rset(t, slot, child)
    else:
        # 2b: n grows by the child's first token
        nset(t, n, LENGTH, node[n, LENGTH] + 1)
        nset(t, n, REF, seq_end - node[n, LENGTH])
        nset(t, child, LENGTH, node[child, LENGTH] - 1)
        nset(t, child, REF, node[child, REF] + 1)
        nset(t, child, TOKEN, buf[node[child, REF]])
        if node[child, TOKEN] != token:
            map_erase(t, n, token)
            map_insert(t, n, node[child, TOKEN], child)


@compiled_inline
def _append_into(t, slot, n, child, token, at):
    """append's case 3: the suffix moves into child (its first token is the token)."""
    node, buf = t[0], t[4]
    # 3: the suffix moves into child
    if node[child, LENGTH] == 1:
        _increment_count(t, child)  # 3a
        rset(t, slot, child)
    else:
        # 3b: child splits after its first token
        m = _new_node(t, node[child, COUNT], token, 1, at)
        node[m, PARENT] = n
        _replace_in_siblings(t, child, m)
        map_set(t, n, token, m)
        nset(t, child, LENGTH, node[child, LENGTH] - 1)
        nset(t, child, REF, node[child, REF] + 1)
        nset(t, child, TOKEN, buf[node[child, REF]])
        map_insert(t, m, node[child, TOKEN], child)
        node[m, NCHILD] = 1
        nset(t, child, PARENT, m)
        node[m, HEAD] = child
        node[m, TAIL] = child
        nset(t, child, GROUP, _new_group(t, child))
        _increment_count(t, m)
        rset(t, slot, m)


@compiled
def remove(t, start, length):
    """SuffixTree::remove of the sequence buf[start : start + length] (not journaled: the global tree)."""
    node, group, meta, ring, buf, keys, values, journal = t
    meta[M_STEP_NODES] = meta[M_NODES]
    meta[M_STEP_GROUPS] = meta[M_GROUPS]
    for first in range(length):
        n = ROOT
        nset(t, ROOT, COUNT, node[ROOT, COUNT] - 1)
        i = first
        while i < length:
            token = buf[start + i]
            child = child_of(t, n, token)
            if child == -1:
                break
            if node[child, COUNT] > 1:
                _decrement_count(t, child)
            else:  # only this suffix passes: the child and its subtree go
                _remove_from_siblings(t, child)
                map_erase(t, n, token)
                nset(t, n, NCHILD, node[n, NCHILD] - 1)
                break
            i += node[child, LENGTH]
            n = child
        # the last node visited may merge with its only child
        if n != ROOT and node[n, NCHILD] == 1:
            c = node[n, HEAD]
            if node[n, COUNT] == node[c, COUNT]:
                map_erase(t, n, node[c, TOKEN])  # n is gone (C++ frees it with its children map)
                nset(t, c, TOKEN, node[n, TOKEN])
                nset(t, c, LENGTH, node[c, LENGTH] + node[n, LENGTH])
                nset(t, c, REF, node[c, REF] - node[n, LENGTH])
                nset(t, c, PARENT, node[n, PARENT])
                _replace_in_siblings(t, n, c)
                map_set(t, node[c, PARENT], node[c, TOKEN], c)


# ---------------------------------------------------------------------------------------------
# Speculation


@compiled
def match_context(t, pattern, first, last):
    """SuffixTree::_match_context of pattern[first:last] -> (node, index within it) or (-1, -1)."""
    node = t[0]
    buf = t[4]
    n = ROOT
    i = 0
    for j in range(first, last):
        token = pattern[j]
        if i >= node[n, LENGTH]:
            n = child_of(t, n, token)
            if n == -1:
                return -1, -1
            i = 0
        if buf[node[n, REF] + i] != token:
            return -1, -1
        i += 1
    return n, i


@compiled
def active_match(t, length):
    """Where the current sequence's last `length` tokens end (length <= its active suffixes): the
    active node of that suffix, at its end — what match_context finds for them."""
    node = t[0]
    meta = t[2]
    ring = t[3]
    size = meta[M_RING_SIZE]
    n = ring[(meta[M_RING_HEAD] + size - length) % meta[M_DEPTH]]
    return n, node[n, LENGTH]


@compiled
def speculate_path(t, n, i, max_tokens, min_token_prob, out_tokens, out_probs):
    """SuffixTree::_speculate_path -> number of tokens written to out_tokens/out_probs (float32)."""
    node = t[0]
    buf = t[4]
    prob = np.float32(1.0)
    count = 0
    while count < max_tokens and prob >= min_token_prob:
        if i < node[n, LENGTH]:
            out_tokens[count] = buf[node[n, REF] + i]
            out_probs[count] = prob
            count += 1
            i += 1
        else:
            c = node[n, HEAD]
            if c == -1:
                break
            prob = prob * (np.float32(node[c, COUNT]) / np.float32(node[n, COUNT]))
            n = c
            i = 0
    return count


@compiled_inline
def length_limit(match_len, max_spec_factor, max_spec_offset):
    """(int)(match_len * factor + offset + 1e-6): float32 product and sum, the 1e-6 in double, truncated."""
    x = np.float32(np.float32(match_len) * max_spec_factor) + max_spec_offset
    return int(np.float64(x) + 1e-6)
